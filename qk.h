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
   Entangled maps run on statevectors up to QK_MAX_STATE_QUBITS; local ones (zz linear/circular,
   hea rings, ...) also on matrix product states of their exact bond bound, any qubit count (path
   MPS, CPU engine; chosen beyond 30 qubits and where cheaper; docs/mps.md).

   Data flow: qk_gram validates the data, the planner (>>planner) decides the whole job in a
   qk_plan (engine, path, precision, tiles and slabs, states bulk or tiled, K resident or in a
   ring, host staging, the kernel configuration), and an engine executes it: the CPU engine here
   or the GPU engine in qk_cuda.cu (qk_cuda_gram), which reads the plan's fields and the numbers
   it shares with the planner (>>engine). Both engines evaluate a map through the same helpers
   (>>meaning), so the CPU engine is the GPU engine's oracle (docs/api.md, docs/gpu.md).

   Conventions (docs/maps.md): qubit 0 is the least significant bit of the basis index (Qiskit's
   order); feature i drives qubit i. Gate matrices are Qiskit's / PennyLane's:
     RX(t) = [[c, -is], [-is, c]], RY(t) = [[c, -s], [s, c]], c = cos(t/2), s = sin(t/2)
     RZ(t) = diag(e^{-it/2}, e^{it/2}), P(t) = diag(1, e^{it}), RZZ(t) = exp(-i t/2 Z(x)Z)

   Configuration macros (define before the implementation include)
   ---------------------------------------------------------------
     QK_IMPLEMENTATION    expand the implementation in this translation unit
     QK_PROF_ENABLE       record qk's own profiler zones (qk_prof.h; docs/profiler.md); needs
                          qk_prof.h beside qk.h, and QK_PROF_IMPLEMENTATION (rule below)
     QK_PROF_IMPLEMENTATION  expand qk_prof.h's implementation (rule below)
     QK_STATIC            make every function static (private to that translation unit); the
                          CUDA engine's entry points (qk_cuda_*, QK_CUDA_DEF) stay extern, so
                          QK_STATIC with QK_CUDA=1 links against qk_cuda.cu
     QK_CUDA              1: the CUDA engine (qk_cuda.cu) is linked
     QK_ASSERT(c)         internal invariants (the work schedule's bands, the streaming .npy
                          writer's bounds, the MPS bond bounds; default: assert from <assert.h>)
     QK_MALLOC(sz) / QK_REALLOC(p, sz) / QK_FREE(p)
                          the allocator of every host allocation of the library (all three or
                          none; thread-safe, as malloc): maps, readers, the engines' scratch,
                          the cache. qk_ctx_desc.allocator, where set, serves only the context's
                          own blocks (the qk_ctx, its thread pool; docs/api.md says why)
     QK_NO_THREADS        build the CPU engine without pthreads (single threaded)
     QK_NO_MPS / QK_NO_TUNE / QK_NO_CSV
                          compile a subsystem out (as stb's STBI_NO_*): the MPS engine (path MPS
                          and maps beyond QK_MAX_STATE_QUBITS: QK_ERROR_UNSUPPORTED; the planner
                          keeps the statevector), the autotune cache (qk_tune_cache_*:
                          QK_ERROR_UNSUPPORTED; the GPU planner takes the fixed table), the CSV
                          reader (qk_csv_read: QK_ERROR_UNSUPPORTED); each message names the define
     QK_NO_VECTOR_EXT     plain loops instead of GCC/Clang vector extensions in the CPU Gram
     QK_NO_DISPATCH       no runtime dispatch of the CPU kernels (the Gram's micro-kernels, the MPS
                          path's site kernel, the gradient's products): where the target lacks
                          AVX2 (x86-64 built without -march, e.g. a wheel), GCC/Clang builds also get
                          AVX2 + FMA and AVX-512F kernels (target attributes) chosen by the CPU
                          at run time (__builtin_cpu_supports; QK_CPU_ISA, qk_cpu_isa_set: docs/api.md,
                          "CPU instruction sets"); this define keeps the baseline's
     QK_TUNE_CACHE        compile the autotune cache (qk_tune_*) without the CUDA engine; a
                          CPU-only build otherwise carries stubs returning QK_ERROR_UNSUPPORTED
     QK_TUNE_CACHE_MAX_ENTRIES / QK_TUNE_CACHE_MAX_BYTES
                          bounds of the autotune cache file (docs/autotune.md)
     QK_MPI               declare and build qk_gram_mpi(), K over the ranks of an MPI
                          communicator (qk.h includes <mpi.h>; compile with mpicc or Meson's
                          mpi dependency; docs/scale.md)
     QK_CPU_SLAB_BYTES / QK_MGPU_MIN_PAIRS / QK_MGPU_HOST_BOUND_SPLIT / QK_MPI_BLOCK_BYTES /
     QK_MPI_SYNC_BYTES
                          the defaults of the run-time tunables of the same names in
                          qk_gram_desc (cpu_slab_bytes, mgpu_min_pairs, ...; 0 there = this
                          default): the CPU engine's streamed slab (128 MB), the pairs per GPU
                          that deal K to several GPUs (2^25), whether a host-bound K(X,X) is
                          dealt to several GPUs (0; yes into a page-locked HOST buffer), qk_gram_mpi's block buffer (512 MB) and
                          sync interval (256 MB); docs/api.md, "Tunables"
     QK_MAX_REPS / QK_MAX_OPS / QK_MAX_WEIGHTS
                          bounds of a map (1024 reps, 2^20 ops, 2^20 weights), checked before
                          anything is allocated (the same in every translation unit)
     QK_CSV_MAX_BYTES / QK_CSV_MAX_LINE
                          bounds of qk_csv_read (16 GiB file, 16 MiB line)

   The profiler (qk_prof.h) and the two implementation defines
   ------------------------------------------------------------
   qk.h works alone: copy it without qk_prof.h for the CPU engine. Its implementation includes
   "qk_prof.h" when QK_PROF_ENABLE is defined (it must then be found) or, without it, when the
   compiler finds the file (__has_include), so QK_PROF_* macros used by the program stay
   available as no-ops; when it is absent qk defines its own zone macros as no-ops.
   The rule: each header's implementation is expanded by its own define, and when qk records its
   own zones (QK_PROF_ENABLE where QK_IMPLEMENTATION is defined) both go in the same file, before
   the include:
       #define QK_PROF_ENABLE           (or -DQK_PROF_ENABLE for the whole program)
       #define QK_IMPLEMENTATION
       #define QK_PROF_IMPLEMENTATION   (this file and no other)
       #include "qk.h"
   QK_IMPLEMENTATION with QK_PROF_ENABLE but without QK_PROF_IMPLEMENTATION is a compile-time
   #error, and so is QK_PROF_IMPLEMENTATION (with QK_PROF_ENABLE) in a file that includes qk.h
   without QK_IMPLEMENTATION (whichever header comes first). A file that includes only
   qk_prof.h cannot be checked: there the rule is yours to keep (else: multiple definitions).

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

   Contents (grep for the tag; generated from the sources' tags by src/amalgamate.py: the
   declarations first, then the implementation; [file] is the source in src/ to edit)
   ------------------------------------------------------------------------------
   >>results        qk_result, error strings, the detail message [qk_api.h]
   >>maps           feature maps: ops, angles, built-ins, the spec parser's entry points [qk_api.h]
   >>context        qk_ctx and its desc (device, threads, allocator, log) [qk_api.h]
   >>gram           qk_gram and its desc (outputs, precision, path, progress) [qk_api.h]
   >>vjp            the gradient of a loss of K for every weight (qk_gram_vjp) [qk_api.h]
   >>states_in      K from given states: a simulator's own statevectors (qk_gram_states) [qk_api.h]
   >>mps_in         K from given matrix product states (qk_gram_mps_states) [qk_api.h]
   >>plan           device info, qk_plan, the planner and the VRAM estimator [qk_api.h]
   >>npy            arrays, .npy and .csv [qk_api.h]
   >>tune           the autotune cache [qk_api.h]
   >>schedule       the work schedule (K dealt to MPI ranks x GPUs) [qk_api.h]
   >>meaning        the map's meaning shared with qk_cuda.cu (angles, one-qubit matrices, layout) [qk_engine.h]
   >>engine         numbers the planner and the GPU engine share (pass qubits, configurations, tensor-core engines) [qk_engine.h]
   >>cuda           the CUDA engine's surface (QK_CUDA_DEF, implemented in qk_cuda.cu) [qk_engine.h]
   >>mpi            qk_gram_mpi (declared under QK_MPI; may come after a plain include of qk.h) [qk_mpi.h]
   >>internal       what the sources share: includes, config macros, types, each source's internal functions [qk_internal.h]
   >>prof_impl      qk's own profiler zones (qk_prof.h; nothing without QK_PROF_ENABLE; the zone macros: qk_internal.h) [prof.c]
   >>config         defaults, the allocator (the includes and config macros: qk_internal.h) [base.c]
   >>errors         results, the detail message [base.c]
   >>mps_prog       the MPS program: sites, bond bounds, steps (is a wide map MPS-able?) [mps_prog.c]
   >>maps_impl      maps, angles, data checks [map.c]
   >>parser         the map spec parser [map_parse.c]
   >>cpu_pool       CPU engine: thread pool, the Gram job and its progress / cancel polls [cpu_pool.c]
   >>cpu_states     CPU engine: states [cpu_states.c]
   >>cpu_gram       CPU engine: states for many samples, the blocked Gram tiles [cpu_gram.c]
   >>npy_impl       .npy / .csv readers and writers [io.c]
   >>npy_stream     the streaming .npy writer [sink_npy.c]
   >>sink           the output of a Gram: opened once, written by the executor, committed once [sink_npy.c]
   >>cpu_stream     CPU engine, streamed output [cpu_stream.c]
   >>cpu_run        CPU engine: a job run (all of K, state tiles, streamed), qk__cpu_gram [cpu_run.c]
   >>schedule_impl  the work schedule (K dealt to MPI ranks x GPUs) [schedule.c]
   >>mps            the MPS engine [engine_mps.c]
   >>tune_impl      the autotune cache (JSON) [tune.c]
   >>planner        device info, planner, VRAM estimator [plan.c]
   >>ctx            the context (qk_ctx), qk_plan_make, qk_plan_describe [ctx.c]
   >>delivery       the GPU engine's host-side slabs to the caller's output; several GPUs [run_cuda.c]
   >>gram_impl      qk_gram and qk_states: validate, plan, open the sink, hand plan + sink to the executor [gram.c]
   >>vjp            qk_gram_vjp: the gradient of a loss of K for every weight (adjoint sweeps); qk_gram_projected [vjp.c]
   >>mpi_impl       qk_gram_mpi: K over the ranks of an MPI communicator [run_mpi.c]

   License: MIT (end of file).
*/
#ifndef QK_H
#define QK_H

/* The rule for the two implementation defines (documentation block above): qk_prof.h's
   implementation goes in the file that defines QK_IMPLEMENTATION, and only there. */
#if defined(QK_PROF_ENABLE) && defined(QK_PROF_IMPLEMENTATION) && !defined(QK_IMPLEMENTATION)
#error "qk.h: QK_PROF_IMPLEMENTATION belongs in the file that defines QK_IMPLEMENTATION (define both there, before the first include of qk.h; qk.h, 'The profiler and the two implementation defines')"
#endif

#include <stddef.h>
#include <stdint.h>
#include <math.h> /* cos, sin of the shared one-qubit matrices (qk__u1) */

#define QK_VERSION_MAJOR 0
#define QK_VERSION_MINOR 1
#define QK_VERSION_PATCH 0
#define QK_VERSION_STRING "0.1.0"

/* Largest state (in qubits) the statevector engines build; product maps have no such limit. */
#define QK_MAX_STATE_QUBITS 30
/* Largest qubit count of any map (product maps evaluated analytically; entangled maps beyond
   QK_MAX_STATE_QUBITS on the MPS path). */
#define QK_MAX_PRODUCT_QUBITS 4096
/* Largest bond dimension of the MPS path (docs/mps.md): an entangled map is MPS-able when the exact
   bond bound of its circuit is at most this. Define before including qk.h to change it. */
#ifndef QK_MPS_MAX_BOND
#define QK_MPS_MAX_BOND 64
#endif

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

/* >>meaning ---- the map's meaning shared with qk_cuda.cu (angles, one-qubit matrices, layout) ---- */
/* Small inline helpers that the CPU engine (qk.h) and the GPU engine (qk_cuda.cu, where QK__HD
   is __host__ __device__) both call, so that the CPU oracle and the GPU cannot drift: an op's
   angle, the 2x2 matrix of a one-qubit op, the BASIS op's bit, and the layout of a product
   map's per-qubit 2-vectors. Private (qk__), declared here because qk_cuda.cu includes qk.h
   without QK_IMPLEMENTATION. */
#if defined(__CUDACC__)
#define QK__HD __host__ __device__
#else
#define QK__HD
#endif

/* theta = scale * f(x, w) + offset, f by the angle's kind (qk_map_angles, docs/maps.md). */
static QK__HD inline double qk__angle_value(const qk_angle *a, const double *x, const double *w)
{
    double f;
    switch (a->kind) {
    case QK_ARG_X: f = x[a->x0]; break;
    case QK_ARG_XX: f = x[a->x0] * x[a->x1]; break;
    case QK_ARG_PIXX: f = (3.14159265358979323846 - x[a->x0]) * (3.14159265358979323846 - x[a->x1]); break;
    case QK_ARG_W: f = w[a->w]; break;
    case QK_ARG_WX: f = w[a->w] * x[a->x0]; break;
    case QK_ARG_CONST: default: f = 0.0; break;
    }
    return a->scale * f + a->offset;
}

/* The BASIS op flips its qubit where its feature is 1 (qk_map_check_data admits 0 or 1 only). */
static QK__HD inline int qk__basis_one(double feature) { return feature > 0.5; }

/* Qubits an op acts on (the amplitude encoding: all, 0 here); whether it carries an angle. */
static QK__HD inline int qk__op_arity(qk_op_kind k)
{
    return (k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ) ? 2 : (k == QK_OP_AMPLITUDE ? 0 : 1);
}
static QK__HD inline int qk__op_has_angle(qk_op_kind k)
{
    return k == QK_OP_RX || k == QK_OP_RY || k == QK_OP_RZ || k == QK_OP_P || k == QK_OP_RZZ;
}

/* The 2x2 matrix of a one-qubit op of kind `kind` at angle t (conventions at the top of this
   file), m = (m00 re, m00 im, m01 re, m01 im, m10 re, m10 im, m11 re, m11 im); basis_one: a
   BASIS op's qk__basis_one. Returns 0, with m the identity, where the op acts as the identity
   (BASIS on a 0) or is no one-qubit op. */
static QK__HD inline int qk__u1(int kind, double t, int basis_one, double *m)
{
    const double c = cos(0.5 * t), s = sin(0.5 * t), h = 0.70710678118654752440;
    int i;
    for (i = 0; i < 8; ++i) m[i] = 0;
    switch (kind) {
    case QK_OP_H: m[0] = h; m[2] = h; m[4] = h; m[6] = -h; return 1;
    case QK_OP_X: m[2] = 1; m[4] = 1; return 1;
    case QK_OP_Y: m[3] = -1; m[5] = 1; return 1;
    case QK_OP_Z: m[0] = 1; m[6] = -1; return 1;
    case QK_OP_RX: m[0] = c; m[3] = -s; m[5] = -s; m[6] = c; return 1;
    case QK_OP_RY: m[0] = c; m[2] = -s; m[4] = s; m[6] = c; return 1;
    case QK_OP_RZ: m[0] = c; m[1] = -s; m[6] = c; m[7] = s; return 1;
    case QK_OP_P: m[0] = 1; m[6] = cos(t); m[7] = sin(t); return 1;
    case QK_OP_BASIS: if (basis_one) { m[2] = 1; m[4] = 1; return 1; } break;
    default: break;
    }
    m[0] = 1; m[6] = 1;
    return 0;
}

/* A product map's per-qubit 2-vector u = u0 |0> + u1 |1> (its one-qubit ops applied to |0>), as
   4 values (double on the CPU, the precision on the GPU): qubit k of row s at 4 * (s * q + k),
   in this order. */
enum { QK__QV_RE0 = 0, QK__QV_IM0 = 1, QK__QV_RE1 = 2, QK__QV_IM1 = 3 };
/* ---- end meaning ---- */

/* Given states (qk_gram_states) travel through the engines as a map of one op, QK__OP_STATE,
   that no map a user builds can hold (qk_map_make refuses kinds past QK_OP_KIND_COUNT_): the
   op's q0 is the qk_state_type, q1 its flags, angle.x0 the amplitudes per state (dim); the map's
   n_features is a row's stride in 8-byte units, and the data x of the Gram are the states' bytes
   seen as doubles (every engine moves rows of n_features doubles; only the state builders read
   them as amplitudes). */
#define QK__OP_STATE QK__OP_STATE_
enum { QK__STATE_NORMALIZE = 1, QK__STATE_PROVIDER = 2, QK__STATE_DEVICE = 4 };
/* Mixed states (qk_gram_states with a_mixed / b_mixed): every row is a density matrix (a pure
   side against a mixed one is expanded to |psi><psi| first), read as the real vector
   [Re rho | Im rho] (2 dim^2 values; real types: Re rho alone), whose real Gram is
   Tr(rho_i rho_j) for Hermitian rho; the plan's linear flag keeps it unsquared. */
enum { QK__STATE_MIXED = 8 };
/* Device states read by a GPU other than the one they live on (several GPUs, qk__mgpu_run: the
   parts of every GPU but the first): the part's map has QK__STATE_PEER in place of
   QK__STATE_DEVICE, and the engine treats the rows as streamed host states, copied in by tile
   from the first GPU's memory (cudaMemcpyDefault: peer to peer where the GPUs allow it). */
enum { QK__STATE_PEER = 16 };
static QK__HD inline int qk__state_esize(int type)
{
    return type == QK_STATE_C128 ? 16 : type == QK_STATE_F32 ? 4 : 8;
}
static QK__HD inline int qk__state_complex(int type) { return type == QK_STATE_C128 || type == QK_STATE_C64; }
/* The bytes of a given state's elements (its op: dim amplitudes, or dim^2 entries of a density
   matrix), without the padding of a caller's ld past them. */
static inline size_t qk__state_row_bytes(const qk_op *o)
{
    const size_t dim = (size_t)o->angle.x0;
    return (size_t)qk__state_esize(o->q0) * (o->q1 & QK__STATE_MIXED ? dim * dim : dim);
}
/* Amplitude k of a given state's row, as doubles. */
static QK__HD inline void qk__state_amp(const void *row, int type, int64_t k, double *re, double *im)
{
    switch (type) {
    case QK_STATE_C128: *re = ((const double *)row)[2 * k]; *im = ((const double *)row)[2 * k + 1]; break;
    case QK_STATE_C64: *re = ((const float *)row)[2 * k]; *im = ((const float *)row)[2 * k + 1]; break;
    case QK_STATE_F64: *re = ((const double *)row)[k]; *im = 0; break;
    default: *re = ((const float *)row)[k]; *im = 0; break;
    }
}
static inline int qk__map_is_states(const qk_map *m) { return m->n_ops == 1 && m->ops[0].kind == QK__OP_STATE; }
/* Given MPS (qk_gram_mps_states) travel as a map of one op, QK__OP_MPS, whose map struct is a
   qk__mpsmap (qk_internal.h): the MPS planner reads the bonds from it and the MPS engine's state
   builder packs the tensors instead of building them; the Gram's x and y are &side[0], &side[1]
   (never read), n_features 0. */
#define QK__OP_MPS QK__OP_MPS_
static inline int qk__map_is_mps(const qk_map *m) { return m->n_ops == 1 && m->ops[0].kind == QK__OP_MPS; }

/* >>engine ---- numbers the planner and the GPU engine share (pass qubits, configurations, tensor-core engines) ---- */
/* The planner (qk.h) decides with the GPU engine's own numbers, defined once here and read by
   both (qk_cuda.cu includes qk.h): the planner counts what the engine will allocate and names the
   kernel it will run, the engine executes what the plan says.
     QK__PASS_QUBITS    qubits of one state pass in shared memory (2^13 complex128: 128 KB of
                        Hopper's 227 KB opt-in); larger states take several passes and a state
                        buffer (qk_cuda.cu's pass scheduler, the planner's VRAM estimator)
     QK__N_FUSED_CFG    fused Gram kernel configurations, qk_plan.kernel_cfg 1..QK__N_FUSED_CFG
                        (0: the fixed table, qk__fused_cfg_fixed)
     QK__TC_MAX_QUBITS  largest state of the tensor-core engines (the int leading dimensions of
                        the FP32X3 operands, 4W, stay far from 2^31)
     QK__TCF_NOFLUSH_MAX_QUBITS  largest state of the fused tensor-core kernel's TF32 and FP16
                        modes (TCF_TF32, TCF_FP16): their one set of accumulators runs all k-stages on
                        the tensor cores' truncating fp32 adds, an error that grows with 2^q, past the fp32
                        state bound beyond this (docs/benchmarks.md, 'Figures behind the code's constants'). FP32X3 flushes into round-to-nearest sums every
                        QK__TCF_FLUSH stages; flushing the others spills registers. */
#define QK__PASS_QUBITS 13
#define QK__N_FUSED_CFG 8
#define QK__TC_MAX_QUBITS 24
#define QK__TCF_NOFLUSH_MAX_QUBITS 16

/* The one-qubit diagonal ops, Z, RZ and P (diag(m00, m11) of qk__u1), and the parity rule, one
   for every engine (the CPU state builder, the MPS program, the GPU program compiler, the
   parameter budget below): ops k, k + 1, k + 2 are CX(c,t) D(t) CX(c,t) with D one of those,
   which is D's diagonal taken on the parity bit c xor t, one diagonal two-qubit op (Z: Z(x)Z,
   RZ(t): RZZ(t), P(t): e^{it} where the bits differ). */
static inline int qk__op_diag1(int k) { return k == QK_OP_Z || k == QK_OP_RZ || k == QK_OP_P; }
static inline int qk__parity_at(const qk_op *ops, int n_ops, int k)
{
    const qk_op *o = &ops[k];
    return o->kind == QK_OP_CNOT && k + 2 < n_ops && qk__op_diag1(o[1].kind) && o[1].q0 == o->q1 &&
           o[2].kind == QK_OP_CNOT && o[2].q0 == o->q0 && o[2].q1 == o->q1;
}

/* The per-sample parameter budget of the GPU engine's compiled program: 8 per one-qubit gate,
   1 + q + q*q per run of diagonal ops, 4 per qubit. The planner's VRAM estimator counts with it
   and qk_cuda.cu allocates it; its compiler (qk__compile, which folds leading one-qubit gates
   into 4 values per qubit, so it needs at most this) checks that the program it compiled fits,
   and fails the job with an internal error otherwise (every GPU suite job checks it). */
static inline int64_t qk__cuda_params(const qk_map *m)
{
    int64_t gates = 0, runs = 0, q = m->n_qubits;
    int i, in_diag = 0;
    for (i = 0; i < m->n_ops; i++) {
        qk_op_kind k = m->ops[i].kind;
        int diag = qk__op_diag1(k) || k == QK_OP_CZ || k == QK_OP_RZZ;
        if (qk__parity_at(m->ops, m->n_ops, i)) {
            diag = 1;
            i += 2;
        }
        if (k == QK_OP_AMPLITUDE || k == QK__OP_STATE) continue;
        if (diag) { if (!in_diag) runs++; in_diag = 1; continue; }
        in_diag = 0;
        if (k != QK_OP_CNOT) gates++;
    }
    return 8 * gates + runs * (1 + q + q * q) + 4 * q + 1;
}

/* The fixed table: the fused configuration for a q-qubit state without autotune: for complex
   fp32 states with float K, the persistent few-qubit kernel on the tensor cores from 2 to 6
   qubits (fp16 hi/lo splits at fp32 accuracy, faster than the SIMT persistent kernel at each of those
   sizes: docs/benchmarks.md, 'Few-qubit Gram on the tensor cores') and the SIMT one at 1 qubit; 64x64 t4x4 for the other small states
   (2^q <= 32: fewer registers, more blocks in flight) and for fp64 (accumulators twice the
   size), else 128x64 t8x4 (complex) or 128x128 t8x8 (real). */
static inline int qk__fused_cfg_fixed(int q, int f64, int cplx, int f32out)
{
    if (!f64 && cplx && f32out && q <= 6) return q >= 2 ? 8 : 7;
    return q <= 5 || f64 ? 1 : cplx ? 2 : 4;
}
/* The fused configurations the engine has (the autotuner's candidates): 1, 2, 4, 7, 8. */
static inline int qk__fused_cfg_kept(int cfg) { return cfg == 1 || cfg == 2 || cfg == 4 || cfg == 7 || cfg == 8; }
/* The tile shape of fused configuration cfg (1..QK__N_FUSED_CFG), as plans name it. */
static inline const char *qk__fused_cfg_name(int cfg)
{
    switch (cfg) {
    case 1: return "64x64 t4x4";
    case 2: return "128x64 t8x4";
    case 4: return "128x128 t8x8";
    case 7: return "persistent t8x4";
    case 8: return "persistent tc 3xfp16";
    default: return "?";
    }
}
/* The fused configuration that runs for cfg (0: the fixed table) on a q-qubit state, f64: double
   states, cplx: complex, f32out: float K. 8, the few-qubit kernel on the tensor cores, takes
   complex fp32 states with float K and 2 <= q <= 6, else it runs as 7; 7, the persistent SIMT
   kernel, takes the same with q <= 5, else it runs as 1; 3 (64x128 t4x8), 5 (64x64 with register
   stores) and 6 (64x64 with k-steps of 16) were never the fastest candidate in the autotune sweeps
   at 4 to 16 qubits (docs/benchmarks.md, "Autotune (issue 5)" and "Build time of the CUDA engine")
   and were removed, so they run as 1, as does anything else out of 1..QK__N_FUSED_CFG (a tune
   cache may still name them). qk__fused_cfg_kept says which remain. The planner writes the
   result into qk_plan.kernel_cfg (the plan names the kernel that runs, after the autotune too)
   and the engine's launcher resolves with it. */
static inline int qk__fused_cfg_runs(int cfg, int q, int f64, int cplx, int f32out)
{
    const int small = !f64 && cplx && f32out;
    if (cfg == 0) cfg = qk__fused_cfg_fixed(q, f64, cplx, f32out);
    if (cfg == 8 && !(small && q >= 2 && q <= 6)) cfg = 7;
    if (cfg == 7 && !(small && q <= 5)) cfg = 1;
    return cfg >= 1 && cfg <= QK__N_FUSED_CFG && cfg != 3 && cfg != 5 && cfg != 6 ? cfg : 1;
}
/* The same for the fused tensor-core kernel of engine e (TCF engines; configurations 1 and 2 on
   mma.sync, 0: 1; 4, the wgmma kernel of compute capability 9.0, FP16 and FP32X3 only, which
   the planner names only where the device runs it, qk_device_info.wgmma): FP32X3 runs 2 unless
   4 (two accumulator sets fill its registers), TF32 runs 1 for 4. */
static inline int qk__tcf_cfg_runs(qk_gpu_engine e, int cfg)
{
    if (cfg == 4 && e != QK_GPU_TCF_TF32) return 4;
    return e == QK_GPU_TCF_FP32X3 ? 2 : cfg >= 1 && cfg <= 2 ? cfg : 1;   /* 0 and the removed 3 run 1 */
}
/* The tensor-core engine (qk_plan.engine) of a precision: TF32, FP32X3, FP16, FP64's real form
   (fp64_real_form), else FUSED (none). */
static inline qk_gpu_engine qk__tc_engine(qk_precision p, int fp64_real_form)
{
    return p == QK_PRECISION_TF32 ? QK_GPU_TC_TF32 : p == QK_PRECISION_FP32X3 ? QK_GPU_TC_FP32X3
         : p == QK_PRECISION_FP16 ? QK_GPU_TC_FP16 : p == QK_PRECISION_FP64 && fp64_real_form ? QK_GPU_TC_FP64 : QK_GPU_FUSED;
}
/* What kind of engine e is: a cuBLAS engine (a slab workspace of products, then the |.|^2
   epilogue: CUBLAS .. TC_FP64), one of them on the tensor cores (TC_TF32 .. TC_FP64), the fused
   tensor-core kernel (TCF_*); the fused kernel of a cuBLAS tensor-core mode and back (TF32,
   FP32X3, FP16 have both; else FUSED). */
static inline int qk__engine_blas(qk_gpu_engine e) { return e >= QK_GPU_CUBLAS && e <= QK_GPU_TC_FP64; }
static inline int qk__engine_tc(qk_gpu_engine e) { return e >= QK_GPU_TC_TF32 && e <= QK_GPU_TC_FP64; }
static inline int qk__engine_tcf(qk_gpu_engine e) { return e >= QK_GPU_TCF_TF32 && e <= QK_GPU_TCF_FP16; }
static inline qk_gpu_engine qk__engine_tcf_of(qk_gpu_engine tc)
{
    return tc == QK_GPU_TC_TF32 ? QK_GPU_TCF_TF32 : tc == QK_GPU_TC_FP32X3 ? QK_GPU_TCF_FP32X3
         : tc == QK_GPU_TC_FP16 ? QK_GPU_TCF_FP16 : QK_GPU_FUSED;
}
static inline qk_gpu_engine qk__engine_tc_of(qk_gpu_engine tcf)
{
    return tcf == QK_GPU_TCF_TF32 ? QK_GPU_TC_TF32 : tcf == QK_GPU_TCF_FP32X3 ? QK_GPU_TC_FP32X3
         : tcf == QK_GPU_TCF_FP16 ? QK_GPU_TC_FP16 : QK_GPU_FUSED;
}
/* The engine's name, as plans and the autotune cache write it ("engine=<name>,cfg=<c>"); NULL
   for a value out of range. */
static inline const char *qk__engine_name(qk_gpu_engine e)
{
    static const char *const names[QK_GPU_ENGINE_COUNT] = {"fused", "cublas", "cublas-3m", "tc-tf32", "tc-fp32x3", "tc-fp16",
                                                           "tc-bf16", "tc-fp64", "tcf-tf32", "tcf-fp32x3", "tcf-fp16"};
    return (int)e >= 0 && (int)e < (int)QK_GPU_ENGINE_COUNT ? names[e] : NULL;
}
/* The engine a plan runs (plan.engine; use_blas, its deprecated copy, is not read), or
   QK_GPU_ENGINE_COUNT, which no engine accepts, for a value out of range. */
static inline qk_gpu_engine qk__plan_engine(const qk_plan *p)
{
    return (int)p->engine >= 0 && (int)p->engine < (int)QK_GPU_ENGINE_COUNT ? p->engine : QK_GPU_ENGINE_COUNT;
}
/* The kernel configuration that runs engine e at configuration cfg for the plan's states (the
   statevector paths; others: cfg): qk__fused_cfg_runs, qk__tcf_cfg_runs, 0 for the cuBLAS
   engines (no configuration). */
static inline int qk__plan_cfg_runs(const qk_plan *p, qk_gpu_engine e, int cfg)
{
    if (p->path != QK_PATH_REAL && p->path != QK_PATH_COMPLEX) return cfg;
    if (e == QK_GPU_FUSED)
        return qk__fused_cfg_runs(cfg, p->n_qubits, p->precision == QK_PRECISION_FP64, p->path == QK_PATH_COMPLEX, p->out_dtype == QK_F32);
    if (qk__engine_tcf(e)) return qk__tcf_cfg_runs(e, cfg);
    return 0;
}
/* Sets a plan's engine (and its deprecated mirror, use_blas). */
static inline void qk__plan_set_engine(qk_plan *p, qk_gpu_engine e)
{
    p->engine = e;
    p->use_blas = (int)e;
}
/* ---- end engine ---- */

/* >>cuda ---- the CUDA engine's surface (QK_CUDA_DEF, implemented in qk_cuda.cu) ---- */
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
   computes (states, Gram), stream 1 copies K to the host, stream 2 copies given host states in. */
typedef struct qk_cuda_stats {
    int n_streams;
    int n_slabs;
    double busy_ms[4];
    double wall_ms;             /* first event (after the x upload was queued) to the last */
    double states_ms;           /* bulk state construction (0 when states are built in tiles) */
    double gram_ms;             /* first slab's start to the last slab's end (compute stream) */
    double output_ms;           /* first slab's start to the last D2H's end (= gram_ms on device) */
    double deliver_ms;          /* host time in the rows callback (copy-out, file writes) */
    double copyin_bytes;        /* given host states copied in by tile or from a provider, or
                                   device states from the first GPU (several GPUs) (stream 2,
                                   busy_ms[2]: the copy-in stream); a tile's last row without
                                   the padding of the caller's ld past its elements */
    int n_shrinks;              /* times the device ran out of memory and the job restarted on the
                                   planner's next smaller plan (qk__plan_shrink) */
    char shrink_why[160];       /* the first of those failures */
} qk_cuda_stats;
/* The profiler's entry points the CUDA engine's GPU zones call (qk_prof.h's functions of the
   same names): qk_cuda.cu is compiled once, without the profiler, and records its zones ("qk
   states", "qk gram slab", "qk D2H slab", tracked buffers, stream names) only through this table,
   which qk.h's implementation hands over in qk_cuda_io.prof where it is built with
   QK_PROF_ENABLE (NULL otherwise: no zones, no profiler symbols needed at link time). */
struct qk_prof_site;
typedef struct qk_cuda_prof_hooks {
    void (*gpu_begin)(struct qk_prof_site *site, void *stream);
    void (*gpu_end)(const char *name, void *stream);
    void (*stream_name)(void *stream, const char *name);
    void (*track)(const char *name, const void *ptr, size_t bytes, const char *dtype, int ndim, const int64_t *shape);
    void (*untrack)(const void *ptr);
    void (*counter)(struct qk_prof_site *site, double value, int add);
} qk_cuda_prof_hooks;
/* The stream pool of one GPU (design card: "stream pool"): the compute, copy and epilogue streams,
   the cuBLAS handle and the jobs' large device buffers (states, scratch, workspace, K's slab
   ring), created once on the GPU current at qk_cuda_pool_create and kept by the
   context (one per GPU) across calls. A Gram job on that GPU borrows it whole and hands it back
   synchronised; a job that finds it lent, or on another GPU, makes its own for the call, as without
   a pool. qk_cuda_pool_destroy makes the pool's GPU current while it destroys (then restores the
   caller's). */
typedef struct qk_cuda_pool qk_cuda_pool;
QK_CUDA_DEF qk_result qk_cuda_pool_create(qk_cuda_pool **out, char *err, size_t err_size);
QK_CUDA_DEF void qk_cuda_pool_destroy(qk_cuda_pool *pool);
/* Device memory the pool holds for the next job (its buffers by role, kept across calls): the
   planner counts it as free, as the job reuses it (0 for NULL). */
QK_CUDA_DEF size_t qk_cuda_pool_bytes(const qk_cuda_pool *pool);
/* The host side of a GPU Gram: where staged slabs go, the pinned staging to use, the figures. */
typedef struct qk_cuda_io {
    qk_rows_fn rows;            /* host-side slabs (NULL only for DEVICE or pinned HOST output) */
    void *rows_user;
    void *stage[2];             /* two pinned slabs of stage_bytes owned by the caller (a context
                                   keeps them across calls); NULL or too small: the engine
                                   allocates its own for the call (cudaMallocHost pins ~5 GB/s) */
    size_t stage_bytes;
    qk_cuda_stats *stats;       /* may be NULL */
    const qk_cuda_prof_hooks *prof; /* the profiler's GPU zones (NULL: none) */
    qk_cuda_pool *pool;         /* the GPU's stream pool (NULL: the job makes its own streams) */
    /* Given host states with a provider (qk_gram_states): rows [r0, r1) of side (0: x, 1: y),
       n_features doubles a row, written by fetch into dst (page-locked host memory the engine
       owns), from the thread that called qk_cuda_gram, when the plan needs them; returns QK_OK
       or a result that stops the job (the detail set by the callee). NULL: desc->x, desc->y. */
    qk_result (*fetch)(int side, int64_t r0, int64_t r1, double *dst, void *user);
    void *fetch_user;
    /* The transpose of K as well (a rectangle of K(X,X) whose mirror below the diagonal is this
       job's too: several GPUs' symmetric parts). A HOST output the plan holds page-locked
       (plan.host_pinned): mirror_out, K[i][j] of this job goes to mirror_out[j * mirror_ld + i],
       each slab's transpose made on the device and copied down with the slab (no host copy).
       A staged output: mrows(i0, m, t, m, mrows_user) after rows(i0, ...), t the transpose of
       the slab's rows [i0, i0 + m): n_y rows of m entries, t[j * m + a] = K[i0 + a][j] (the
       same thread and rules as rows; io->stage_bytes then needs two slabs). Both NULL: none;
       neither takes a DEVICE output or a symmetric plan. */
    void *mirror_out;
    int64_t mirror_ld;
    qk_rows_fn mrows;
    void *mrows_user;
    /* A symmetric plan's first band_rows rows alone (0: all n_x): rows [0, band_rows) of K(X,X),
       whole, as the job's first slabs would give them: the diagonal block [0, band_rows)^2 as a
       triangle and its mirror, the rectangle right of it without one (a GPU's band of K(X,X) on
       several GPUs in one call: its states and set-up once). Outputs, progress and stats count
       band_rows rows of n_y. Not with mirror_out / mrows. */
    int64_t band_rows;
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
/* Squared norms of n given device states (qk_gram_states with on_device), rows ld doubles apart,
   dim amplitudes of qk_state_type type; NaN for a row with a non-finite amplitude. Checks that x
   is device memory of the current device. */
QK_CUDA_DEF qk_result qk_cuda_state_norms(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *norms, char *err,
                                          size_t err_size);
/* Density matrices given on the device (qk_gram_states with on_device and a_mixed / b_mixed): per
   matrix of dim x dim entries (rows ld doubles apart), out[3 i] its trace (the real diagonal's
   sum; NaN when an entry is not finite), out[3 i + 1] the largest |rho[a][b] - conj(rho[b][a])|
   (the larger of the real and imaginary parts' differences, as the host check) and out[3 i + 2]
   the largest |rho[a][b]|. Checks that x is device memory of the current device. */
QK_CUDA_DEF qk_result qk_cuda_state_dm_check(const void *x, int64_t n, int64_t ld, int type, int64_t dim, double *out, char *err,
                                             size_t err_size);
/* n pure device states (rows ldx_bytes apart, dim amplitudes of qk_state_type type) as density
   matrices |psi><psi| in fresh device memory of the current device (*out: n rows of ld_out >=
   dim^2 elements of type, zero past dim^2; qk_cuda_dev_free frees it), for a pure device side
   against device matrices (qk_gram_states). Checks that x is device memory of the current device;
   QK_ERROR_DEVICE_OUT_OF_MEMORY when the matrices do not fit. */
QK_CUDA_DEF qk_result qk_cuda_state_outer(const void *x, int64_t n, int64_t ldx_bytes, int type, int64_t dim, int64_t ld_out, void **out,
                                          char *err, size_t err_size);
QK_CUDA_DEF void qk_cuda_dev_free(void *p);
/* A checksum of n given device states (qk_gram_mpi_states with on_device: the ranks compare
   it): the first row_bytes bytes (a multiple of 4) of each row, rows ld doubles apart, as a sum
   over the rows' 4-byte words of a mix of (word, its index, its row), mod 2^64, so that the
   order the device adds them in does not change it. Checks that x is device memory of the
   current device. */
QK_CUDA_DEF qk_result qk_cuda_state_hash(const void *x, int64_t n, int64_t ld, int64_t row_bytes, uint64_t *hash, char *err,
                                         size_t err_size);
/* Page-locked host memory (cudaMallocHost), for staging kept by a context. */
QK_CUDA_DEF qk_result qk_cuda_host_alloc(size_t bytes, void **p, char *err, size_t err_size);
QK_CUDA_DEF void qk_cuda_host_free(void *p);
/* 1 when p is page-locked host memory (cudaMallocHost / cudaHostRegister), else 0. */
QK_CUDA_DEF int qk_cuda_host_pinned(const void *p);
/* Page-locks bytes of the caller's host memory at p for the GPUs' DMA (cudaHostRegister,
   portable, read-only where the device supports it) for the length of a job: given host states
   then cross PCIe at the pinned rate, which pageable copies reach only in part
   (docs/benchmarks.md, 'Host states beyond device memory'). *locked: 1 when this call locked it
   (qk_cuda_host_unlock undoes it), 0 when p was page-locked already or could not be (the copies
   then run from pageable memory: slower, not wrong). Never fails. */
QK_CUDA_DEF void qk_cuda_host_lock(const void *p, size_t bytes, int *locked);
QK_CUDA_DEF void qk_cuda_host_unlock(const void *p);
/* Test seams, declared and compiled only under QK_TEST_FAULTS (define it for qk.h and for
   qk_cuda.cu alike; the GPU test programs do, tests/meson.build): the product build has none. */
#ifdef QK_TEST_FAULTS
/* Tests: the k-th resource acquisition of the GPU engine from now on fails as if out of memory
   (k < 0: the -k-th and every later one; 0: off); the count of acquisitions so far. Not for
   concurrent use. */
QK_CUDA_DEF void qk_cuda_test_fail_alloc(int k);
QK_CUDA_DEF int qk_cuda_test_alloc_count(void);
/* Tests: the bytes of device memory the GPU engine holds now (its cudaMalloc less its cudaFree,
   the contexts' pools included): a leak check that other processes on the GPU do not disturb. */
QK_CUDA_DEF size_t qk_cuda_test_live_bytes(void);
/* Tests: the bytes of X / Y rows (features, or given states) the GPU engine has copied into its
   own device buffers so far; device states read in place add none. */
QK_CUDA_DEF long long qk_cuda_test_rows_in_bytes(void);
/* Tests: on (1) fills the cuBLAS and tensor-core engines' product buffer (C) with NaN before
   their GEMMs, so that an entry the epilogue reads but no GEMM wrote shows as NaN in K (the
   sanitizer runs: docs/gpu.md). Not for concurrent use. */
QK_CUDA_DEF void qk_cuda_test_poison_gemm(int on);
/* Tests: how many state builds so far ran the fused structured pass (qk__k_states_fz: 14-16
   qubit complex fp32 states of two structured passes on compute capability 9.0 or later). */
QK_CUDA_DEF int qk_cuda_test_states_fused(void);
/* Tests: how many state builds so far wrote the fp16 / bf16 / fp32x3 tensor-core engines' operand
   planes themselves (Gauss's form, bulk states of a map: no operand pass in the Gram;
   QK_TC_PLANES=0 turns it off). */
QK_CUDA_DEF int qk_cuda_test_planes(void);
/* Tests: how many launches so far ran the warp-pipelined few-qubit kernel (qk__k_gram_stw: fused
   configuration 8 at 4 qubits, complex fp32 states, float K). */
QK_CUDA_DEF int qk_cuda_test_small_warp(void);
/* Tests: how many slabs so far the cuBLAS tensor-core engines computed in Gauss's form
   (qk__tc_gauss_products: complex states, every tensor-core engine but TC_FP64, not under
   QK_TC_4M=1). */
QK_CUDA_DEF int qk_cuda_test_gauss(void);
/* Tests: 1 where fused configuration 8 at 4 qubits takes qk__k_gram_stw by default on the current
   device (its DRAM bandwidth and occupancy rule), else 0. */
QK_CUDA_DEF int qk_cuda_test_small_warp_default(void);
#endif /* QK_TEST_FAULTS */
/* The GPU engine's figures of the last qk_gram on ctx (zeros when it ran on the CPU engine; on
   several GPUs those of the first). */
QKDEF qk_cuda_stats qk_ctx_cuda_stats(const qk_ctx *ctx);
/* Per GPU of the last qk_gram on ctx: seconds[k] from the job's start to the moment GPU k
   (plan.devices[k]) finished its share, k < the returned count (plan.n_devices; 0 when it ran
   on the CPU engine); at most max values are written. The load balance is max / mean. */
QKDEF int qk_ctx_device_seconds(const qk_ctx *ctx, double *seconds, int max);
/* Per GPU of the last qk_gram on ctx: stats[k] the figures of GPU k (plan.devices[k]), those of
   its last part, with copyin_bytes summed over all its parts (device states on several GPUs:
   the rows GPU k copied from the first GPU's memory; 0 on the first, which reads them in
   place). Returns the count as qk_ctx_device_seconds does; at most max are written. */
QKDEF int qk_ctx_device_stats(const qk_ctx *ctx, qk_cuda_stats *stats, int max);
/* Makes ordinal the calling thread's current CUDA device (cudaSetDevice); the GPU engine runs
   on the current device. */
QK_CUDA_DEF qk_result qk_cuda_set_device(int ordinal, char *err, size_t err_size);
/* A monotonic clock, seconds (std::chrono::steady_clock). */
QK_CUDA_DEF double qk_cuda_wtime(void);
/* States of n samples built on the device, copied back as interleaved complex doubles (tests). */
/* qk_gram_vjp on the GPU engine (qk.h's vjp.c calls it for a context on the CUDA engine, after
   checking the desc): the current device, fp64; real: the map's states are real (one plane: DSYRK /
   DGEMM, else ZHERK / ZGEMM); pool: the context's stream pool (its stream and cuBLAS handle are
   borrowed; NULL: the call makes its own); stage: two page-locked host buffers of stage_bytes
   each (the context's), through which a pageable G and k_out cross (NULL: straight). G is checked
   on the host while it is copied (QK_ERROR_NON_FINITE names the first entry that is not finite).
   grad_w and k_out are written only on success. */
QK_CUDA_DEF qk_result qk_cuda_gram_vjp(const qk_map *map, const qk_vjp_desc *desc, int real, qk_cuda_pool *pool, void *const stage[2],
                                       size_t stage_bytes, char *err, size_t err_size);
/* qk_gram_projected on the GPU engine (qk.h's vjp.c calls it for a context on the CUDA engine,
   after checking the desc and choosing the path as the CPU engine does): the current device,
   fp64. Each sample's 3q features (rho00, Re rho01, Im rho01 of every qubit's reduced density
   matrix) come from one of three sources, then K = exp(-2 gamma |f - f'|^2) over pairs on the
   device, into desc->out (ld_out, out_dtype f64 / f32; written only on success). */
typedef struct qk_cuda_pq {
    /* product maps: the features computed on the host (n_x x 3q and, K(X,Y), n_y x 3q) */
    const double *fx, *fy;
    /* the MPS path (mps != 0): build(side, r0, r1, &lanes, user) gives samples [r0, r1) of x
       (side 0) or y (side 1) in the MPS engine's lane layout (groups of nj samples, group
       doubles each, site s at off[s] of a group, entry (l * 2 + a) * D[s + 1] + r of site s at
       e * 2 nj, its imaginary part nj later; sample i of a group at lane i); the buffer is the
       provider's, valid until its next call; a failure returns its error with the message set
       (by qk.h). Site s is qubit order[s]; D: n_sites + 1 bonds. At most chunk samples a call. */
    int mps;
    int n_sites, nj;
    const int *D, *order;
    const int64_t *off;
    int64_t group, chunk;
    qk_result (*build)(int side, int64_t r0, int64_t r1, const double **lanes, void *user);
    void *user;
    /* neither: the statevector path, the map's states built on the device (real: one plane) */
    int real;
} qk_cuda_pq;
/* err empty on a failure: the provider's error (its message already set in qk.h). pool: the
   context's stream pool (NULL: the call makes its own stream). */
QK_CUDA_DEF qk_result qk_cuda_gram_projected(const qk_map *map, const qk_gram_desc *desc, double gamma, const qk_cuda_pq *src,
                                             qk_cuda_pool *pool, char *err, size_t err_size);
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
   engine = blas[best] (a qk_gpu_engine), kernel_cfg = cfg[best]. */
typedef struct qk_cuda_tune_result {
    int n;                      /* candidates timed */
    int blas[16], cfg[16];      /* the candidate's engine (qk_gpu_engine) and kernel_cfg */
    double ms[16];              /* median milliseconds per K(X,X) of n_samples */
    int best;
    int64_t n_samples;
} qk_cuda_tune_result;
QK_CUDA_DEF qk_result qk_cuda_tune_gram(const qk_plan *plan, int64_t n_samples, int reps, qk_cuda_tune_result *res,
                                        char *err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif /* QK_H */

/* >>mpi ---- qk_gram_mpi (declared under QK_MPI; may come after a plain include of qk.h) ---- */
#if defined(QK_MPI) && !defined(QK_H_MPI)
#define QK_H_MPI
#include <mpi.h>
#ifdef __cplusplus
extern "C" {
#endif
/* K over the ranks of comm (collective: every rank of comm calls it, with the same map, the same
   X (and Y) data and the same desc apart from the callbacks; each rank's ctx picks its engine:
   the CPU, or the rank's GPU through ctx's cuda_device). The rows of K are dealt to the ranks by
   qk_schedule_make (balanced by pair count); each rank computes its band with qk_gram on
   sub-problems, block by block (two buffers of QK_MPI_BLOCK_BYTES of host memory; a writer
   thread writes one while the next is computed when MPI provides MPI_THREAD_SERIALIZED or
   more: then no other thread of the program may call MPI during the call, unless MPI runs
   MPI_THREAD_MULTIPLE; callbacks are called as qk_gram calls them, never inside an MPI call).
   On the CPU engine the result is
   bitwise the K of one qk_gram: every entry comes from the same states and the same kernel, in
   the same orientation (<x_i|x_j> for i <= j; the lower triangle is written as the mirror).
   Outputs (desc->output):
     QK_OUTPUT_NPY       one .npy file, out_path, on a file system every rank sees: rank 0
                         creates a temporary file next to it (out_path.tmp.<pid>.<k>.<host>) and writes
                         the header; every rank writes its rows, and the mirror of its upper-
                         triangle part, at their offsets with MPI-IO (independent
                         MPI_File_write_at on a per-rank handle); after every rank has synced
                         (unless no_sync) and closed, rank 0 renames it over out_path. On any
                         rank's failure no file is left and out_path is untouched.
     QK_OUTPUT_CALLBACK  each rank's tile_fn gets the tiles of its own band, in K's coordinates
                         (square tiles, each delivered once on one rank; symmetric: j0 >= i0
                         tiles only, diagonal tiles whole, as qk_gram).
   HOST and DEVICE output return QK_ERROR_UNSUPPORTED. desc->progress reports this rank's entries
   of K (done of this rank's total); a non-zero return cancels the whole job. Any rank's failure
   (bad data, I/O, cancel, a GPU error) stops the others at their next progress poll inside the
   block they compute (qk_gram's polls: a tile, a few ms of state building), and every rank
   returns the first failing rank's result with its detail ("rank 2 of 4: ..."). Also an error on
   every rank: ranks that disagree on the sizes, the dtype or the data (a checksum of X and Y). */
QKDEF qk_result qk_gram_mpi(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, MPI_Comm comm);
/* K from given states over the ranks of comm (qk_gram_states' K, qk_gram_mpi's executor;
   collective: every rank passes the same states and desc, desc->x and desc->y NULL), in one of
   three forms, the same on every rank (docs/states.md, "Over MPI ranks"):
     host states   states->a, states->b (statevectors or density matrices, every type, lda /
                   ldb): every rank checks them as qk_gram_states does (finite, norms or traces
                   within norm_tol of 1, or normalize) and the ranks compare them (a checksum of
                   each row's elements, not its padding);
     a provider    (either engine; one GPU a rank) each rank's provider is asked only for the
                   rows its blocks need (K(A,A): its band and the rows right of it; K(A,B): its
                   band of A and all of B), block by block in chunks, and the rows are checked
                   as they come. It must give the same row for an index on every rank and
                   request: a row given twice unlike before is an error, and the ranks compare
                   the hashes of the rows several were given before the .npy is committed. A
                   provider failure on one rank is every rank's QK_ERROR_CANCELLED ("rank 1 of
                   3: qk_gram_mpi_states: the state provider failed for A rows [9, 29) ...");
     device states on_device, a context on the GPU engine: each rank's pointers on its GPU (its
                   context's first) hold all the states; each rank's engine reads its blocks'
                   rows in place (never copied); checked on the device, compared across ranks by
                   a checksum computed there (qk_cuda_state_hash).
   A bad state is every rank's error, naming the row ("rank 0 of 3: A[5]: amplitude 2 is NaN").
   On the CPU engine the K is bitwise qk_gram_states' in one process; on the GPU engine within
   the precision's bound (each block is its own qk_gram). Outputs as qk_gram_mpi. */
QKDEF qk_result qk_gram_mpi_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, MPI_Comm comm);
#ifdef __cplusplus
}
#endif
#endif /* QK_MPI */

/* ======================================================================================== */
/*                                    IMPLEMENTATION                                        */
/* ======================================================================================== */
#if defined(QK_IMPLEMENTATION) && !defined(QK_IMPLEMENTATION_DONE)
#define QK_IMPLEMENTATION_DONE

/* >>internal ---- what the sources share: includes, config macros, types, each source's internal functions ---- */
/* src/qk_internal.h — the internal header of qk's implementation (not installed, not for users).

   qk is developed as one C file per subsystem (the .c files of src/) and shipped as one header:
   the generator (src/amalgamate.py) inlines this header and then the sources, in the order of
   src/qk_unity.h, into qk.h, where every internal function is static. In development each source is also its own
   translation unit (the development build: meson's test tu-compile, and -Ddev=true, which runs
   the CPU suite against a library of the sources; docs/vendoring.md, "Developing qk"), and then a
   source sees only what this header declares: the config macros and the types more than one
   source uses, and, per source, the internal functions (and data) that later sources call.

   The layering is checked by the compiler: the translation unit of a source is compiled with
   QK__LAYER set to its place in the order (QK__L_<SOURCE> below, -DQK__LAYER=QK__L_MAP for
   src/map.c), and the section of a source is seen only by that source and those after it, so a
   call into a later source does not compile (implicit declaration, an error at -Werror), nor a
   call into a source's function it does not export (static there). In qk.h (QK_IMPLEMENTATION)
   every section is seen, in order, before the first source.

   To export a function to later sources: mark its definition QK__PRIV instead of static and
   declare it in its source's section here (the development build compiles with
   -Wmissing-prototypes, so a QK__PRIV function without its declaration fails). QK__PRIV is
   static in qk.h and external (hidden) in the development build. Data: the definition is
   QK__PRIV too, the declaration (extern) is for the development build only (#ifndef
   QK_IMPLEMENTATION), since C++ does not take a static object's declaration before its
   definition. A type or macro that a later source uses lives here, in its source's section. */
#ifndef QK_INTERNAL_H
#define QK_INTERNAL_H
#ifndef QK_IMPLEMENTATION /* a source compiled alone (the development build): qk.h's declarations */
#endif

/* The sources in their order (src/qk_unity.h's; amalgamate.py --check compares the two). */
#define QK__L_PROF 1
#define QK__L_BASE 2
#define QK__L_MPS_PROG 3
#define QK__L_MAP 4
#define QK__L_MAP_PARSE 5
#define QK__L_CPU_POOL 6
#define QK__L_CPU_STATES 7
#define QK__L_CPU_GRAM 8
#define QK__L_IO 9
#define QK__L_SINK_NPY 10
#define QK__L_CPU_STREAM 11
#define QK__L_CPU_RUN 12
#define QK__L_SCHEDULE 13
#define QK__L_ENGINE_MPS 14
#define QK__L_TUNE 15
#define QK__L_PLAN 16
#define QK__L_CTX 17
#define QK__L_RUN_CUDA 18
#define QK__L_GRAM 19
#define QK__L_VJP 20
#define QK__L_RUN_MPI 21
#define QK__L_ALL 22

#if defined(QK_IMPLEMENTATION)
#define QK__LAYER QK__L_ALL
#define QK__PRIV static
#else
#if !defined(QK__LAYER)
#error "qk_internal.h: a source compiled alone needs -DQK__LAYER=QK__L_<SOURCE> (its place in src/qk_unity.h), or QK_IMPLEMENTATION (all of qk.h)"
#endif
#if defined(QK_STATIC)
#error "qk_internal.h: QK_STATIC is for qk.h (the amalgamation), not for sources compiled one by one"
#endif
#if defined(__GNUC__) || defined(__clang__)
#define QK__PRIV __attribute__((visibility("hidden")))
#else
#define QK__PRIV
#endif
#endif
/* A function kept out of line: a private map type read through its embedded qk_map (the given
   MPS, qk__mpsmap) where gcc, having inlined the callee into a caller that allocated a plain
   qk_map, would see the read past that allocation (-Warray-bounds at -O3) on a path the map's op
   kind rules out. */
#if defined(__GNUC__) || defined(__clang__)
#define QK__NOINLINE __attribute__((noinline))
#else
#define QK__NOINLINE
#endif

/* ---- prof.c: qk's own profiler zones (qk_prof.h, or no-op zone macros) ---- */
#if QK__LAYER >= QK__L_PROF
#if defined(QK_PROF_ENABLE)
#if defined(QK_IMPLEMENTATION) && !defined(QK_PROF_IMPLEMENTATION)
#error "qk.h: QK_PROF_ENABLE with QK_IMPLEMENTATION: define QK_PROF_IMPLEMENTATION in this file too, before including qk.h, and in no other file (qk.h, 'The profiler and the two implementation defines')"
#endif
#if defined(QK_CUDA) && QK_CUDA && !defined(QK_PROF_CUDA)
#define QK_PROF_CUDA
#endif
#include "qk_prof.h"
#elif defined(QK_PROF_H)
/* qk_prof.h already included: its disabled macros serve */
#elif defined(__has_include)
#if __has_include("qk_prof.h")
#include "qk_prof.h"
#endif
#endif
#if !defined(QK_PROF_ENABLE) && !defined(QK_PROF_H)
/* qk.h alone (no qk_prof.h): the zone macros qk uses compile to nothing. The replacement lists
   are qk_prof.h's disabled ones, token for token, so a later include of qk_prof.h redefines them
   identically (no warning). */
#define QK_PROF_ENABLED 0
#define QK_PROF_U_(x) ((void)sizeof(x))
#define QK_PROF_BEGIN(name) QK_PROF_U_(name)
#define QK_PROF_END(name) QK_PROF_U_(name)
#define QK_PROF_THREAD_NAME(name) QK_PROF_U_(name)
#define QK_PROF_COUNTER(name, value) (QK_PROF_U_(name), QK_PROF_U_(value))
#define QK_PROF_COUNT(name, delta) (QK_PROF_U_(name), QK_PROF_U_(delta))
#define QK_PROF_TRACK(name, ptr, bytes) (QK_PROF_U_(name), QK_PROF_U_(ptr), QK_PROF_U_(bytes))
#define QK_PROF_UNTRACK(ptr) QK_PROF_U_(ptr)
#endif
/* the hook table handed to the CUDA engine (qk_cuda_io.prof), NULL where the profiler is off */
#if defined(QK_CUDA) && QK_CUDA && defined(QK_PROF_ENABLE)
#ifndef QK_IMPLEMENTATION
extern QK__PRIV const qk_cuda_prof_hooks qk__prof_cuda_hooks;
#endif
#define QK__PROF_CUDA_HOOKS (&qk__prof_cuda_hooks)
#else
#define QK__PROF_CUDA_HOOKS NULL
#endif
#endif /* prof.c */

/* ---- base.c: includes, config macros, the allocator, errors ---- */
#if QK__LAYER >= QK__L_BASE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <errno.h>

#ifndef QK_ASSERT
#include <assert.h>
#define QK_ASSERT(c) assert(c)
#endif

/* The allocator: stb's macros, QK_MALLOC / QK_REALLOC / QK_FREE (define all three before the
   implementation include, or none: malloc, realloc, free), behind qk__malloc, qk__calloc,
   qk__realloc and qk__free, the one path of every host allocation of the library. Why the
   macros and not an allocator in a desc (sokol's way): most of qk's allocations happen where no
   context is in reach (qk_map_*, the readers and qk_array_free, the autotune cache, the work
   schedule), and the CPU engine's worker threads allocate their scratch, so the allocator must
   be reachable everywhere and thread-safe, which a compile-time one is by contract (as malloc);
   the fault-injection test (tests/core/test_alloc_fail.c) overrides them to fail every allocation in
   turn. qk_ctx_desc.allocator stays for the programs that set it: it serves the context's own
   blocks (the qk_ctx, its thread pool) through qk__alloc_with / qk__free_with. */
#if defined(QK_MALLOC) && defined(QK_FREE) && defined(QK_REALLOC)
/* caller's allocator */
#elif !defined(QK_MALLOC) && !defined(QK_FREE) && !defined(QK_REALLOC)
#define QK_MALLOC(sz) malloc(sz)
#define QK_REALLOC(p, sz) realloc(p, sz)
#define QK_FREE(p) free(p)
#else
#error "qk.h: define all of QK_MALLOC, QK_REALLOC and QK_FREE, or none"
#endif

#if defined(__cplusplus)
#define QK__TLS thread_local
#elif defined(_MSC_VER)
#define QK__TLS __declspec(thread)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define QK__TLS _Thread_local
#else
#define QK__TLS __thread
#endif

#if !defined(QK_NO_THREADS) && (defined(_WIN32) || !(defined(__GNUC__) || defined(__clang__)))
#define QK_NO_THREADS /* the CPU engine's thread pool needs pthreads and GCC/Clang atomics */
#endif
#ifndef QK_NO_THREADS
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

/* The thread shim: a mutex, a condition variable and a joinable thread, pthreads or, under
   QK_NO_THREADS, no-ops (a lock always succeeds; a thread never starts, so the caller runs the
   function itself, and a condition is never waited on: only a started thread waits):
       if (!qk__thread_start(&t, fn, arg)) fn(arg);   ...   if (started) qk__thread_join(t);
   Every engine (the CPU pool, the streamed writers, the .npy syncer, several GPUs, MPI) takes its
   locks and starts its threads through it, so the call sites have no #ifdef; QK__THREADS is 0
   where a thread that cannot start means "run it here" rather than a failure. */
#ifndef QK_NO_THREADS
#define QK__THREADS 1
typedef pthread_mutex_t qk__mutex;
typedef pthread_t qk__thread;
static inline int qk__mutex_init(qk__mutex *m) { return pthread_mutex_init(m, NULL); }   /* 0: ok */
static inline void qk__mutex_destroy(qk__mutex *m) { pthread_mutex_destroy(m); }
static inline void qk__mutex_lock(qk__mutex *m) { pthread_mutex_lock(m); }
static inline int qk__mutex_trylock(qk__mutex *m) { return pthread_mutex_trylock(m) == 0; }   /* 1: taken */
static inline void qk__mutex_unlock(qk__mutex *m) { pthread_mutex_unlock(m); }
typedef pthread_cond_t qk__cond;
static inline int qk__cond_init(qk__cond *c) { return pthread_cond_init(c, NULL); }   /* 0: ok */
static inline void qk__cond_destroy(qk__cond *c) { pthread_cond_destroy(c); }
static inline void qk__cond_wait(qk__cond *c, qk__mutex *m) { pthread_cond_wait(c, m); }
static inline void qk__cond_signal(qk__cond *c) { pthread_cond_signal(c); }
static inline void qk__cond_broadcast(qk__cond *c) { pthread_cond_broadcast(c); }
static inline int qk__thread_start(qk__thread *t, void *(*fn)(void *), void *arg) { return pthread_create(t, NULL, fn, arg) == 0; }
static inline void qk__thread_join(qk__thread t) { pthread_join(t, NULL); }
static inline void qk__yield(void) { sched_yield(); }
static inline long qk__pid(void) { return (long)getpid(); }
static inline qk__thread qk__thread_self(void) { return pthread_self(); }
static inline int qk__thread_is_self(qk__thread t) { return pthread_equal(pthread_self(), t) != 0; }
#else
#define QK__THREADS 0
typedef struct qk__mutex { char unused; } qk__mutex;
typedef int qk__thread;
static inline int qk__mutex_init(qk__mutex *m) { (void)m; return 0; }
static inline void qk__mutex_destroy(qk__mutex *m) { (void)m; }
static inline void qk__mutex_lock(qk__mutex *m) { (void)m; }
static inline int qk__mutex_trylock(qk__mutex *m) { (void)m; return 1; }
static inline void qk__mutex_unlock(qk__mutex *m) { (void)m; }
typedef struct qk__cond { char unused; } qk__cond;   /* waited on only where a thread started */
static inline int qk__cond_init(qk__cond *c) { (void)c; return 0; }
static inline void qk__cond_destroy(qk__cond *c) { (void)c; }
static inline void qk__cond_wait(qk__cond *c, qk__mutex *m) { (void)c; (void)m; }
static inline void qk__cond_signal(qk__cond *c) { (void)c; }
static inline void qk__yield(void) {}
static inline long qk__pid(void) { return 0; }
static inline void qk__cond_broadcast(qk__cond *c) { (void)c; }
static inline int qk__thread_start(qk__thread *t, void *(*fn)(void *), void *arg) { (void)fn; (void)arg; *t = 0; return 0; }
static inline void qk__thread_join(qk__thread t) { (void)t; }
static inline qk__thread qk__thread_self(void) { return 0; }
static inline int qk__thread_is_self(qk__thread t) { (void)t; return 1; }
#endif

#define QK__PI 3.14159265358979323846
#define QK__UNUSED(x) ((void)(x))
/* The CPU engine's lanes: the columns of a Gram micro-kernel (cpu_gram.c), the samples of an MPS
   group (mps_prog.c, engine_mps.c): 8 doubles, one zmm with AVX-512. */
#define QK__NJ 8

#define QK__ESC_ARG_MAX 200
#define QK__ESC_ARG_SIZE (4 * QK__ESC_ARG_MAX + 32)

QK__PRIV int qk__def_i(int v, int d);                 /* v, or d where v is 0 */
QK__PRIV double qk__def_d(double v, double d);
QK__PRIV void *qk__malloc(size_t n);                  /* QK_MALLOC, never of 0 bytes */
QK__PRIV void *qk__calloc(size_t count, size_t size);
QK__PRIV void *qk__realloc(void *p, size_t n);         /* QK_REALLOC, never to 0 bytes */
QK__PRIV void qk__free(void *p);                       /* QK_FREE */
QK__PRIV void *qk__alloc_with(const qk_allocator *a, size_t n);   /* the context's blocks */
QK__PRIV void qk__free_with(const qk_allocator *a, void *p);
QK__PRIV const char *qk__esc(char *buf, size_t size, const char *s, size_t n, size_t max);
QK__PRIV const char *qk__esc_arg(char *buf, size_t size, const char *s);
QK__PRIV void qk__esc_msg(char *dst, size_t size, const char *src);
#ifndef QK_IMPLEMENTATION
extern QK__PRIV QK__TLS char qk__errbuf[512];         /* the detail message (qk_last_error) */
#endif
QK__PRIV void qk__set_error(const char *fmt, ...);
QK__PRIV qk_result qk__fail(qk_result r, const char *fmt, ...);
QK__PRIV int qk__prec_f32(qk_precision p);
#endif /* base.c */

/* ---- mps_prog.c: the MPS program (sites, bond bounds, steps) ---- */
#if QK__LAYER >= QK__L_MPS_PROG
#define QK__MPS_SAT (1 << 30)      /* bounds saturate here (an unusable map) */
#define QK__MPS_SET 8              /* distinct qubits per side tracked per bond and run */

enum { QK__MPS_CNOT = 1, QK__MPS_CZ, QK__MPS_RZZ, QK__MPS_PARITY };

typedef struct qk__mps_step {
    int kind;           /* 1: one-qubit op on site s0; 2: two-qubit op on sites s0 < s1 */
    int op;             /* op index (its angle; PARITY: the middle diagonal op) */
    int s0, s1;
    int gate;           /* two-qubit: QK__MPS_CNOT, CZ, RZZ, PARITY */
    int proj_left;      /* two-qubit: the projector side (the op's q0) is site s0 */
    int64_t b;          /* two-qubit: index into bounds of bonds s0+1 .. s1 after this step */
} qk__mps_step;

typedef struct qk__mps_prog {
    int q, n_steps, folded, span, dense;
    int chi;            /* largest bond bound (QK__MPS_SAT when the walk stopped early) */
    int chi_bond;       /* where: the bond between sites chi_bond-1 and chi_bond */
    int *order;         /* q: site -> qubit */
    int *D;             /* q+1: bond dimensions; D[0] = D[q] = 1, D[b] between sites b-1 and b */
    int64_t *off;       /* q+1: doubles from a group's start to site s (lane layout) */
    int64_t group;      /* doubles per group of QK__NJ samples */
    double pair_flops;  /* real flops per overlap (4 per complex multiply-add) */
    qk__mps_step *steps;
    int *bounds;
    int64_t n_bounds;
    int exact_chi;      /* the circuit's bound (chi is capped at max_bond when truncating) */
    int max_bond;       /* truncation (qk_gram_desc.mps_max_bond, mps_cutoff): 0 and 0 = exact */
    double cutoff;
    int given;          /* the MPS are given (qk_gram_mps_states): packed, not built; no steps */
} qk__mps_prog;

/* qk_gram_mps_states' map (QK__OP_MPS, qk_engine.h): the map first (the engines' map pointer is
   this). The tensors stay the caller's; D and scale are made and checked by gram.c. */
typedef struct qk__mpsmap {
    qk_map map;
    qk_op op;
    qk_mps_states_desc in;  /* the caller's, defaults resolved (type, norm_tol) */
    int *D;                 /* n_sites + 1: the largest bond over every sample of both sides */
    double *scale;          /* n_a + n_b: each sample's factor on every site (1, or ||psi||^(-1/q)) */
    char side[2];           /* the Gram's x and y point here */
} qk__mpsmap;

QK__PRIV void qk__mps_prog_free(qk__mps_prog *p);
QK__PRIV qk_result qk__mps_prog_make_t(const qk_map *m, int max_bond, double cutoff, qk__mps_prog *p);
QK__PRIV qk_result qk__mps_prog_make(const qk_map *m, qk__mps_prog *p);
QK__PRIV int qk__mps_bond_of(const qk_map *m);
#endif /* mps_prog.c */

/* ---- map.c: maps; numbers in C syntax whatever the locale ---- */
#if QK__LAYER >= QK__L_MAP
typedef struct qk__radix { char s[8]; size_t n; } qk__radix;   /* s: NUL-terminated */
typedef struct qk__ops {
    qk_op *ops;
    int n, cap;
    int oom;
} qk__ops;

QK__PRIV void qk__radix_init(qk__radix *r);
QK__PRIV const char *qk__fmt_g(char *buf, size_t size, double v, int prec);
QK__PRIV int qk__fmt_angle(const qk_angle *a, char *buf, size_t size);
QK__PRIV int qk__ci_eq(const char *s, size_t n, const char *word);
QK__PRIV size_t qk__num_len(const char *s, size_t n, int special);
QK__PRIV int qk__strtod_c(const char *s, size_t n, const qk__radix *rx, double *v);
QK__PRIV void qk__push(qk__ops *l, qk_op_kind kind, int q0, int q1, qk_angle a);
QK__PRIV qk_angle qk__ang(qk_arg_kind kind, int x0, int x1, int w, double scale, double offset);
QK__PRIV qk_angle qk__noang(void);

/* qk_gram_states' map (QK__OP_STATE, qk_engine.h): the map first, so that the engines' map
   pointer is this; with a provider the Gram's x and y are &smap->side[0] and &side[1], which the
   state builders hand to the provider as the side and never read. */
typedef struct qk__smap {
    qk_map map;
    qk_op op;
    qk_states_desc in;      /* the caller's, defaults resolved (lda, ldb, norm_tol, type) */
    int q;
    char side[2];
    void *buf;              /* provider rows: chunk rows of ld elements */
    void *pa, *pb;          /* packed copies of a and b (rows not whole doubles apart, or unaligned) */
    void *dev_pure;         /* a pure device side against device matrices: it as |psi><psi| on the device */
    int64_t ld, chunk;
    const char *fn;         /* the entry point, which begins the messages (qk_gram_states, qk_gram_mpi_states) */
    /* A provider's tags: the Gram's x tag (&side[0]) asks for rows of side tag_side[0] from row
       tag_row0[0] on, its y tag (&side[1]) for side tag_side[1] from tag_row0[1] (qk__smap_make:
       {0, 1} and {0, 0}; qk_gram_mpi_states points them at a sub-job's block of K). rows_fn (when
       set) sees each chunk the provider gave, after its check, and may fail it (error set). */
    int tag_side[2];
    int64_t tag_row0[2];
    qk_result (*rows_fn)(void *user, int side, int64_t row0, int64_t n, const void *rows, int64_t ld_bytes);
    void *rows_user;
    qk_result provider_failed;  /* the provider failed, or its rows were bad (the error set) */
    /* Rows the provider already gave (and were checked): rows [cache_row0, cache_row0 + cache_n)
       of side cache_side, n_features doubles apart; asked rows inside them are copied from here,
       not asked again (qk_gram_mpi_states keeps a slab's rows for its blocks). NULL: none. */
    const char *cache;
    int cache_side;
    int64_t cache_row0, cache_n;
} qk__smap;
QK__PRIV qk_result qk__state_norm_check(const qk__smap *sm, double ss, int side, int64_t row);
QK__PRIV qk_result qk__states_check(const qk__smap *sm, const void *rows, int64_t n, int64_t ld_bytes, int side, int64_t row0);
QK__PRIV qk_result qk__smap_fetch(qk__smap *sm, int side, int64_t row0, int64_t n, void *buf);
#endif /* map.c */

/* ---- map_parse.c: the map spec parser ---- */
#if QK__LAYER >= QK__L_MAP_PARSE
QK__PRIV void qk__cat(char *buf, size_t size, size_t *len, const char *fmt, ...);
#endif /* map_parse.c */

/* ---- cpu_pool.c: the thread pool, the Gram job and its polls ---- */
#if QK__LAYER >= QK__L_CPU_POOL
typedef void (*qk__work_fn)(void *ctx, int thread);
#ifndef QK_NO_THREADS
#define QK__FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define QK__LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define QK__STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#else
#define QK__FETCH_ADD(p, v) ((*(p) += (v)) - (v))
#define QK__LOAD(p) (*(p))
#define QK__STORE(p, v) (*(p) = (v))
#endif
/* a context's pool (without threads, QK_NO_THREADS: no workers, its caller runs every step) */
typedef struct qk__tpool qk__tpool;
typedef struct qk__tpool_worker { qk__tpool *pool; int index; } qk__tpool_worker;
struct qk__tpool {
    int n_workers, quit, want, busy;   /* busy: workers still running the step (atomic) */
    int spin;                          /* the caller's yields, busy read between them, before it blocks */
    long pid;                          /* the process that started the workers (qk__tpool_forked) */
    unsigned gen;
    qk__work_fn fn;
    void *arg;
    qk__mutex mu;
    qk__cond go, done;
    qk__thread th[255];
    qk__tpool_worker w[255];
};

/* The state builders (statevectors, product states, MPS) reach the job's progress callback and
   cancel flag through a qk__poll per thread: it counts the work done (amplitude updates, or an
   estimate of the flops of an MPS step) and every QK__POLL_WORK of it on thread 0, 8x that on
   the others (as the tiles poll), calls qk__job_poll (the callback, from one thread at a time,
   with the pairs done so far: building states adds none). About 1 to 10 ms of work between
   polls; a cancel stops every builder at its next op (or sample), so that a job whose states
   dominate (18-22 qubits, few samples) sees Ctrl-C in a fraction of a second too. */
#define QK__POLL_WORK ((int64_t)1 << 21)
#define QK__POLL_OP_QUBITS 14   /* statevectors: a tick per op from here, per sample below */
typedef struct qk__poll {
    struct qk__gram_job *job;   /* NULL: no polling (qk_states, the GPU engine's builds) */
    int64_t work, every;
} qk__poll;

typedef struct qk__gram_job {
    qk_path path;
    const double *A, *B;        /* states (B == A when symmetric) */
    int64_t na, nb, stride, D;  /* D: complex/real dimension, analytic: qubits */
    int symmetric;
    qk_dtype dt;
    void *out;
    int64_t ld;
    qk_output output;
    qk_tile_fn tile_fn;
    void *tile_user;
    qk_progress_fn progress;
    void *progress_user;
    int64_t tiles_i, tiles_j, n_tiles;
    /* slab mode (streamed output): only tile rows [ti_begin, ti_end) are computed, into out
       with row_base subtracted from the row index; symmetric tiles are mirrored into out only
       where the mirror lands inside the slab (rows < mirror_end), the writer does the rest */
    int64_t ti_begin, ti_end, row_base, mirror_end;
    /* state tiles (plan->bulk_states == 0): one block of K at a time, A and B the blocks'
       states; i_base, j_base: the block's first row and column in K (the callback's
       coordinates); mirror_out: where an off-diagonal block of symmetric K also goes,
       transposed (same ld), or NULL; twice: the block's pairs count twice (its mirror) */
    int64_t i_base, j_base;
    void *mirror_out;
    int twice;
    int64_t next;
    int64_t pairs_done, pairs_total;
    int cancel;                 /* 1: cancelled by a callback */
    qk_result provider_failed;  /* given states: the provider failed or its rows were bad (the error set) */
    int linear;                 /* plan.linear: K = Re <a|b> (density matrices), not |<a|b>|^2 */
    int oom;
    const void *mps;            /* QK_PATH_MPS: the MPS program (qk__mps_prog, MPS engine) */
    size_t scratch;             /* QK_PATH_MPS: per-thread scratch doubles of qk__mps_tile */
    /* QK_PATH_MPS: the MPS engine's tile (qk__mps_tile, set by the MPS engine) */
    void (*mps_tile)(const struct qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n, double *scratch, double *kt);
    int isa;                    /* the kernels' instruction set (qk__cpu_isa when the job was set up) */
    qk__mutex cb_lock;
} qk__gram_job;

QK__PRIV int qk__ncores(void);
/* The CPU kernels' instruction set (cpu_pool.c): the Gram micro-kernels, the MPS transfer
   matrices and the VJP products of a portable x86-64 build (QK__DISPATCH: GCC / Clang vector
   extensions, a target without AVX2, no QK_NO_DISPATCH) are also compiled for AVX2 + FMA and for
   AVX-512F; qk__cpu_isa says which a job uses (QK__ISA_GENERIC: the build's own code, always in
   builds without dispatch), chosen once per process (QK_CPU_ISA, else the best the CPU has) or
   by qk_cpu_isa_set. A job reads it once, when it starts. */
enum { QK__ISA_GENERIC = 0, QK__ISA_AVX2 = 1, QK__ISA_AVX512 = 2 };
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT) && defined(__x86_64__) && !defined(__AVX2__) && \
    !defined(QK_NO_DISPATCH)
#define QK__DISPATCH 1
#endif
QK__PRIV int qk__cpu_isa(void);
QK__PRIV qk_result qk__tpool_start(qk__tpool *t, int n);
QK__PRIV void qk__tpool_stop(qk__tpool *t);
QK__PRIV void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg);
QK__PRIV int qk__tpool_forked(const qk__tpool *t);
#ifndef QK_IMPLEMENTATION
extern QK__PRIV QK__TLS qk__tpool *qk__cur_pool;      /* the calling thread's pool (qk_gram sets it) */
#endif
QK__PRIV void qk__parallel(int n_threads, qk__work_fn fn, void *ctx);
QK__PRIV void qk__job_poll(qk__gram_job *j);
QK__PRIV void qk__poll_init(qk__poll *p, qk__gram_job *job, int thread);
QK__PRIV int qk__poll_tick(qk__poll *p, int64_t work);
#endif /* cpu_pool.c */

/* ---- cpu_states.c: one sample's statevector or product state ---- */
#if QK__LAYER >= QK__L_CPU_STATES
/* Below 12 qubits the table (2^g phases, each a sum of up to g(g+1)/2 angles) costs more than
   the passes it saves (2-core CPU, zz reps=2: 2x slower at 10 qubits; 1.8x faster at 12, 3.9x at
   14, 6.3x at 16, 7.1x at 18). */
#define QK__DIAG_MIN_QUBITS 12
QK__PRIV void qk__apply(const qk_op *o, double t, const double *x, double *re, double *im, int q);
QK__PRIV size_t qk__diag_scratch(int q);
QK__PRIV void qk__state1(const qk_map *m, const double *x, double *re, double *im, double *theta, qk__poll *poll);
QK__PRIV void qk__product1(const qk_map *m, const double *x, double *out, double *theta);
#endif /* cpu_states.c */

/* ---- cpu_gram.c: states for many samples, the blocked Gram tiles ---- */
#if QK__LAYER >= QK__L_CPU_GRAM
#define QK__T 64
#define QK__NI 6
#define QK__DC 256
#define QK__TR (((QK__T + QK__NI - 1) / QK__NI) * QK__NI)   /* tile rows padded to NI */

/* The micro-kernels' vector type and its loads and stores (GCC/Clang vector extensions: cpu_gram.c) */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT)
#define QK__VEC 1
typedef double qk__v8 __attribute__((vector_size(QK__NJ * sizeof(double))));
typedef double qk__v4 __attribute__((vector_size(4 * sizeof(double))));   /* slices: one AVX2 / SSE2 register */
typedef double qk__v2 __attribute__((vector_size(2 * sizeof(double))));
#if defined(__GNUC__) && !defined(__clang__)
#define QK__CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define QK__CONTRACT
#endif
#define QK__LD8(v, p) memcpy(&(v), (p), sizeof(qk__v8))
/* Stores a vector, an element of an accumulator array included, through a whole local vector.
   With memcpy straight from &acc[k] (k < 8 in an array of 8 vectors) gcc 12 under
   -fsanitize=address reported -Warray-bounds "offset [0, 63] is out of the bounds [0, 0]" in
   qk__mps_site4 (an -O2 / -O3 build; a false positive, the access is in bounds): the source of a
   copy is now a whole object of its own. */
#define QK__ST8(p, v) do { qk__v8 qk__st8_ = (v); memcpy((p), &qk__st8_, sizeof(qk__v8)); } while (0)
#define QK__ADD8(p, v) do { qk__v8 t_; memcpy(&t_, (p), sizeof t_); t_ += (v); memcpy((p), &t_, sizeof t_); } while (0)
#endif

#ifndef QK__CONTRACT
#define QK__CONTRACT   /* no vector extensions: plain loops, the compiler's own contraction */
#endif

typedef struct qk__cpu_tiles {
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_path path;
    int64_t R;
    double *A, *B;
} qk__cpu_tiles;

QK__PRIV qk_path qk__path_of(const qk_map *m);
QK__PRIV int64_t qk__row_len(const qk_map *m, qk_path path);
QK__PRIV double *qk__cpu_states(const qk_map *m, const double *x, int64_t row0, int64_t n, qk_path path, int n_threads,
                                struct qk__gram_job *job);
QK__PRIV void qk__cpu_run_tiles(qk__gram_job *j, int nt);
QK__PRIV qk_result qk__cpu_row_block(const qk__cpu_tiles *t, qk__gram_job *j, int64_t i0, int64_t m, char *out,
                                     char *kbase, int nt);
#endif /* cpu_gram.c */

/* ---- io.c: .npy / .csv readers and writers, temporary files ---- */
#if QK__LAYER >= QK__L_IO
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
#include <sys/utsname.h> /* the host in temporary names (qk__host_tag) */
#include <dirent.h>      /* stale temporaries (qk__sweep_tmp) */
#endif

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

QK__PRIV int qk__write_all(int fd, const void *buf, size_t n);
QK__PRIV qk_result qk__open_tmp(const char *path, char **tmp_out, int *fd_out);
QK__PRIV qk_result qk__tmp_commit(const char *tmp, const char *path, int no_sync);
QK__PRIV void qk__tmp_discard(const char *tmp);
QK__PRIV void qk__sync_dir(const char *path);
QK__PRIV qk_result qk__write_file_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb);
QK__PRIV size_t qk__npy_make_header(char hdr[192], qk_dtype dtype, int64_t rows, int64_t cols);
QK__PRIV qk_result qk__npy_shape_bytes(const char *who, qk_dtype dtype, int64_t rows, int64_t cols, size_t *nbytes);
#endif /* io.c */

/* ---- sink_npy.c: the streaming .npy writer ---- */
#if QK__LAYER >= QK__L_SINK_NPY
typedef struct qk__npyw {
    int fd;
    char *tmp;              /* temporary name (QK_MALLOC) */
    const char *path;
    size_t es, hdr;
    int64_t rows, cols;
    int no_sync;
    uint64_t written;
    int *cancel;            /* optional: a job's cancel flag, read before each write */
    qk__thread syncer;
    int syncer_on, stop, sync_errno;
    uint64_t dirty;         /* bytes written since the syncer last started an fsync */
    uint64_t written_mt, synced;  /* bytes written (under mu), and covered by a finished fsync */
    qk__mutex mu;
    qk__cond cv;
} qk__npyw;

QK__PRIV qk_result qk__npyw_open(qk__npyw *w, const char *path, qk_dtype dt, int64_t rows, int64_t cols, int no_sync,
                                 int syncer);
QK__PRIV qk_result qk__npyw_at_fd(qk__npyw *w, int fd, uint64_t off, const void *buf, size_t n);
QK__PRIV qk_result qk__npyw_at(qk__npyw *w, uint64_t off, const void *buf, size_t n);
QK__PRIV qk_result qk__npyw_rows(qk__npyw *w, int64_t i0, int64_t j0, int64_t m, int64_t n, const void *src, int64_t ld);
QK__PRIV qk_result qk__npyw_commit(qk__npyw *w);
QK__PRIV void qk__npyw_abort(qk__npyw *w);
/* the output of a Gram: opened once (qk_gram), written by the executor, committed once */
typedef struct qk__sink {
    qk_output kind;         /* plan->output */
    qk_dtype dtype;         /* plan->out_dtype */
    size_t es;              /* bytes per entry of K */
    int64_t rows, cols;     /* K's shape */
    void *out;              /* HOST, DEVICE: the caller's buffer */
    int64_t ld;             /* its leading dimension (default: cols) */
    qk_tile_fn tile_fn;     /* CALLBACK */
    void *tile_user;
    qk__npyw npy;           /* NPY: the temporary file, open between qk__sink_open and close */
} qk__sink;
#if defined(QK_CUDA) && QK_CUDA
QK__PRIV qk_result qk__npyw_fd(const qk__npyw *w, int *fd);   /* another descriptor of the file (several GPUs) */
#endif
QK__PRIV qk_result qk__sink_open(qk__sink *s, const qk_plan *plan, const qk_gram_desc *desc);
QK__PRIV qk_result qk__sink_close(qk__sink *s, qk_result r);
#endif /* sink_npy.c */

/* ---- cpu_stream.c: K streamed to a .npy by the CPU engine ---- */
#if QK__LAYER >= QK__L_CPU_STREAM
QK__PRIV qk_result qk__cpu_gram_npy(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, int nt,
                                    const qk__cpu_tiles *tl, qk__npyw *w);
#endif /* cpu_stream.c */

/* ---- cpu_run.c: the CPU engine's job ---- */
#if QK__LAYER >= QK__L_CPU_RUN
QK__PRIV void qk__cpu_job_init(qk__gram_job *j, const qk_plan *plan, const qk_gram_desc *desc, const qk__sink *sink, const double *A,
                               const double *B, int64_t stride, int64_t D, const void *mps, size_t scratch);
QK__PRIV void qk__cpu_job_free(qk__gram_job *j);
QK__PRIV qk_result qk__cpu_gram_run(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const double *A, const double *B,
                                    qk__sink *sink);
QK__PRIV qk_result qk__cpu_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink);
#endif /* cpu_run.c */

/* ---- engine_mps.c: the MPS engine and the path choice ---- */
#if QK__LAYER >= QK__L_ENGINE_MPS
/* The MPS path's cost against the statevector's on the GPU engine: the statevector Gram runs on
   cuBLAS near the FP32 peak (complex GEMM, 8 real flops per complex multiply-add), the MPS chain
   (qk_cuda.cu's register kernel, pair_flops counting 4 per complex multiply-add) at an estimated
   third of the FMA peak: about 4x the statevector's time per counted flop. An estimate until
   the mps-gpu case set of bench/run.sh measures the crossover (zz reps=2 linear). */
#ifndef QK__MPS_GPU_FLOP_RATIO
#define QK__MPS_GPU_FLOP_RATIO 4.0
#endif

QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job);
QK__PRIV qk_result qk__mps_check_trunc(const qk_gram_desc *d);
QK__PRIV qk_result qk__mps_decide(const qk_map *map, const qk_gram_desc *desc, double ratio, int sv_ok, int sv_big,
                                  qk__mps_prog *prog, int *use);
QK__PRIV qk_result qk__mps_plan(const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep);
QK__PRIV qk_result qk__mps_decide_cpu(const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *prog, int *use);
QK__PRIV int qk__mps_gpu_chi(int chi);
QK__PRIV void qk__plan_job_fields(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_dtype od, int64_t nx, int64_t ny, int sym);
QK__PRIV qk_result qk__plan_cuda_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                     const qk_gram_desc *desc, const qk__mps_prog *prog, qk_plan *p);
QK__PRIV qk_result qk__mps_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *planned);
QK__PRIV qk_result qk__mps_prog_of(const qk__mps_prog *planned, const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *own,
                                   const qk__mps_prog **out);
#endif /* engine_mps.c */

/* ---- plan.c: the planner ---- */
#if QK__LAYER >= QK__L_PLAN
QK__PRIV qk_precision qk__auto_precision(const qk_map *map, qk_path path, double tol, int wgmma, char *note, size_t size);
QK__PRIV qk_result qk__plan_cpu_nt(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, int nt, qk_plan *p,
                                   qk__mps_prog *keep);
QK__PRIV int qk__mgpu_parts(const qk_plan *plan, int k, int64_t part[2][3]);
QK__PRIV void qk__mgpu_part_desc(const qk_plan *plan, const qk_plan_part *pp, int d, const qk_gram_desc *desc, qk_gram_desc *sd);
QK__PRIV void qk__plan_part_plan(const qk_plan *plan, int i, const char *device_name, qk_plan *sp);
QK__PRIV qk_result qk__plan_part_set(qk_plan *plan, int i, const qk_plan *sp, const char *device_name);
QK__PRIV qk_result qk__mgpu_check_parts(const qk_plan *plan);
QK__PRIV const qk_map *qk__map_for_device(const qk_map *map, int k, qk_map *tmp, qk_op *op);
QK__PRIV qk_result qk__plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                        const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);
#if defined(QK_CUDA) && QK_CUDA
QK__PRIV void qk__plan_autotune(const qk_device_info *info, int mode, const char *cache_dir, qk_log_fn log,
                                void *log_user, qk_plan *plan);
#endif
#endif /* plan.c */

/* ---- ctx.c: the context ---- */
#if QK__LAYER >= QK__L_CTX
struct qk_ctx {
    qk_ctx_desc desc;           /* resolved; desc.cache_dir points at cache_dir below */
    char cache_dir[1024];
    qk_device_info dev;         /* present == 0 on the CPU engine */
    qk_cuda_stats cuda_stats;   /* the last qk_gram on the GPU engine */
    void *stage[2];             /* pinned staging kept across calls (GPU engine, host outputs) */
    size_t stage_bytes;
    int n_dev;                  /* GPUs of the context (0 on the CPU engine); dev is dev_info[0] */
    int dev_ord[QK_MAX_DEVICES];
    qk_device_info dev_info[QK_MAX_DEVICES];
    void *dstage[QK_MAX_DEVICES][2];    /* several GPUs: each one's pinned staging (its thread's) */
    size_t dstage_bytes[QK_MAX_DEVICES];
#if defined(QK_CUDA) && QK_CUDA
    qk_cuda_pool *spool[QK_MAX_DEVICES]; /* each GPU's stream pool, made on its first job there */
#endif
    int n_dev_last;             /* GPUs of the last qk_gram, and when each finished (seconds) */
    double dev_seconds[QK_MAX_DEVICES];
    qk_cuda_stats dev_stats[QK_MAX_DEVICES];   /* several GPUs: each one's (qk_ctx_device_stats) */
    qk__tpool *pool;            /* started on the first qk_gram (NULL: none, threads per step) */
    qk__tpool *gpool;           /* several GPUs: the host threads of GPUs 1.., started on the first such job */
};

QK__PRIV qk_result qk__check_gram(const qk_ctx *ctx, const qk_map *map, const qk_gram_desc *d);
QK__PRIV qk__tpool *qk__ctx_pool_of(qk_ctx *ctx, qk__tpool **slot, int n, int spin);
QK__PRIV qk__tpool *qk__ctx_pool(qk_ctx *ctx);
QK__PRIV qk_result qk__plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);
#endif /* ctx.c */

/* ---- run_cuda.c: the host side of the GPU engine, one GPU and several ---- */
#if QK__LAYER >= QK__L_RUN_CUDA && defined(QK_CUDA) && QK_CUDA
QK__PRIV qk_result qk__cuda_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *mps, qk_cuda_stats *stats);
QK__PRIV qk_result qk__mgpu_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink);
QK__PRIV qk_cuda_pool *qk__cuda_pool(qk_ctx *ctx, int k);
QK__PRIV int qk__ctx_stage(qk_ctx *ctx, size_t need);
#endif /* run_cuda.c */

/* ---- gram.c: qk_gram, qk_states, K from given states ---- */
#if QK__LAYER >= QK__L_GRAM
QK__PRIV qk_result qk__smap_make(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, const char *fn, qk__smap *sm,
                                 qk_gram_desc *g);
QK__PRIV void qk__smap_free(qk__smap *sm);
#endif /* gram.c */
#endif /* QK_INTERNAL_H */
/* >>prof_impl ---- qk's own profiler zones (qk_prof.h; nothing without QK_PROF_ENABLE; the zone macros: qk_internal.h) ---- */
/* qk instruments its own pipeline (zones "qk_gram", "validate", "plan", "states", "gram tile",
   counters "tiles"); build with -DQK_PROF_ENABLE to record them (docs/profiler.md). The rule
   for the two implementation defines is in the documentation block at the top. */
/* The CUDA engine's GPU zones go to the profiler through this table (qk_cuda_io.prof), set only
   where the profiler is on: the one libqk_cuda serves programs with and without it. */
#if defined(QK_CUDA) && QK_CUDA && defined(QK_PROF_ENABLE)
QK__PRIV const qk_cuda_prof_hooks qk__prof_cuda_hooks = {qk_prof_gpu_begin, qk_prof_gpu_end, qk_prof_stream_name,
                                                       qk_prof_track, qk_prof_untrack, qk_prof_counter};
#endif

/* >>config ---- defaults, the allocator (the includes and config macros: qk_internal.h) ---- */

QK__PRIV int qk__def_i(int v, int d) { return v ? v : d; }
QK__PRIV double qk__def_d(double v, double d) { return v != 0.0 ? v : d; }

QK__PRIV void *qk__malloc(size_t n) { return QK_MALLOC(n ? n : 1); }
QK__PRIV void *qk__calloc(size_t count, size_t size)
{
    void *p;
    if (size && count > (size_t)-1 / size) return NULL;
    p = qk__malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}
QK__PRIV void *qk__realloc(void *p, size_t n) { return QK_REALLOC(p, n ? n : 1); }
QK__PRIV void qk__free(void *p) { QK_FREE(p); }
/* The context's own blocks: qk_ctx_desc.allocator where set, else the macros. */
QK__PRIV void *qk__alloc_with(const qk_allocator *a, size_t n) { return a && a->alloc ? a->alloc(n ? n : 1, a->user) : qk__malloc(n); }
QK__PRIV void qk__free_with(const qk_allocator *a, void *p)
{
    if (p && a && a->free) a->free(p, a->user);
    else qk__free(p);
}


/* >>errors ---- results, the detail message ---- */
/* Bytes of a file or of user text quoted in a message: printable ASCII as is, '\\' and
   control and non-ASCII bytes escaped (\n, \t, \r, \0, \xNN), at most max input bytes (then
   "..."). Returns buf. */
QK__PRIV const char *qk__esc(char *buf, size_t size, const char *s, size_t n, size_t max)
{
    size_t i, k = 0;
    int cut = 0;
    if (!size) return buf;
    for (i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        size_t el;
        if (c == '\\') { e[0] = '\\'; e[1] = '\\'; el = 2; }
        else if (c >= 0x20 && c < 0x7f) { e[0] = (char)c; el = 1; }
        else if (c == '\n') { e[0] = '\\'; e[1] = 'n'; el = 2; }
        else if (c == '\t') { e[0] = '\\'; e[1] = 't'; el = 2; }
        else if (c == '\r') { e[0] = '\\'; e[1] = 'r'; el = 2; }
        else if (c == 0) { e[0] = '\\'; e[1] = '0'; el = 2; }
        else { snprintf(e, sizeof e, "\\x%02x", c); el = 4; }
        if (k + el + 4 > size) { cut = 1; break; }   /* room for "..." and the NUL */
        memcpy(buf + k, e, el);
        k += el;
    }
    if ((cut || i < n) && k + 4 <= size) { memcpy(buf + k, "...", 3); k += 3; }
    buf[k] = 0;
    return buf;
}

/* A value the user gave (a path, a spec, an option's value) as a message quotes it: escaped by
   qk__esc, at most QK__ESC_ARG_MAX bytes of it, then "... (N bytes)": a 120000-byte spec is
   not echoed whole, an escape sequence in a file name does not reach the terminal. buf of
   QK__ESC_ARG_SIZE bytes holds any value. Returns buf. */
QK__PRIV const char *qk__esc_arg(char *buf, size_t size, const char *s)
{
    size_t n, k;
    if (!size) return buf;
    if (!s) { snprintf(buf, size, "(null)"); return buf; }
    n = strlen(s);
    qk__esc(buf, size > 24 ? size - 24 : size, s, n, QK__ESC_ARG_MAX);
    k = strlen(buf);
    if (n > QK__ESC_ARG_MAX && size > 24) snprintf(buf + k, size - k, " (%lu bytes)", (unsigned long)n);
    return buf;
}

/* A whole message with every byte that is not printable ASCII escaped by qk__esc, into dst (cut
   with "..." to fit size). A '\\' stays as it is: the message may quote text qk__esc has
   escaped already. The detail message goes through it (qk__set_errorv), so a value the
   message quotes raw (a path) cannot put control bytes on a terminal either. */
QK__PRIV void qk__esc_msg(char *dst, size_t size, const char *src)
{
    size_t k = 0;
    if (!size) return;
    for (; *src; src++) {
        unsigned char c = (unsigned char)*src;
        char e[8];
        size_t el;
        if (c >= 0x20 && c < 0x7f) { e[0] = (char)c; e[1] = 0; }
        else qk__esc(e, sizeof e, src, 1, 1);
        el = strlen(e);
        if (k + el + 4 > size) {   /* room for "..." and the NUL */
            if (k + 4 <= size) { memcpy(dst + k, "...", 3); k += 3; }
            break;
        }
        memcpy(dst + k, e, el);
        k += el;
    }
    dst[k] = 0;
}

QK__PRIV QK__TLS char qk__errbuf[512];


/* Every byte that is not printable ASCII in the message is escaped (qk__esc_msg): values are
   quoted escaped where they are formatted (qk__esc, qk__esc_arg), and anything quoted raw
   still reaches a terminal as text. */
static void qk__set_errorv(const char *fmt, va_list ap)
{
    char raw[sizeof qk__errbuf];
    vsnprintf(raw, sizeof raw, fmt, ap);
    qk__esc_msg(qk__errbuf, sizeof qk__errbuf, raw);
}

QK__PRIV void qk__set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qk__set_errorv(fmt, ap);
    va_end(ap);
}

/* Sets the detail message and returns r: `return qk__fail(QK_ERROR_SHAPE, "...", ...);` */
QK__PRIV qk_result qk__fail(qk_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qk__set_errorv(fmt, ap);
    va_end(ap);
    return r;
}

QKDEF const char *qk_result_string(qk_result r)
{
    switch (r) {
    case QK_OK: return "ok";
    case QK_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case QK_ERROR_NON_FINITE: return "non-finite input";
    case QK_ERROR_SHAPE: return "shape mismatch";
    case QK_ERROR_PARSE: return "map spec parse error";
    case QK_ERROR_TOO_MANY_QUBITS: return "too many qubits";
    case QK_ERROR_ZERO_NORM: return "zero norm";
    case QK_ERROR_BAD_DATA: return "data outside the map's domain";
    case QK_ERROR_OUT_OF_MEMORY: return "out of host memory";
    case QK_ERROR_IO: return "I/O error";
    case QK_ERROR_FORMAT: return "malformed file";
    case QK_ERROR_NO_DEVICE: return "no CUDA device";
    case QK_ERROR_CUDA: return "CUDA error";
    case QK_ERROR_DEVICE_OUT_OF_MEMORY: return "out of device memory";
    case QK_ERROR_CANCELLED: return "cancelled";
    case QK_ERROR_UNSUPPORTED: return "unsupported";
    default: return "unknown qk_result";
    }
}

QKDEF const char *qk_last_error(void) { return qk__errbuf; }

/* Precision names, the one table (qk_precision_name, qk_precision_parse) */
static const char *const qk__prec_names[QK_PRECISION_COUNT] = {"default", "fp32", "fp64", "tf32", "fp32x3", "fp16", "auto"};
QKDEF const char *qk_precision_name(qk_precision p)
{
    return (int)p >= 0 && (int)p < QK_PRECISION_COUNT ? qk__prec_names[p] : "?";
}
QKDEF qk_result qk_precision_parse(const char *s, qk_precision *out)
{
    int k;
    for (k = 0; s && k < QK_PRECISION_COUNT; k++)
        if (!strcmp(s, qk__prec_names[k])) {
            if (out) *out = (qk_precision)k;
            return out ? QK_OK : qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_precision_parse: NULL out");
        }
    return qk__fail(QK_ERROR_INVALID_ARGUMENT, "precision: %s is not one of auto, fp32, fp64, fp32x3, fp16, tf32, default",
                    s ? "the value given" : "NULL");
}
/* The modes whose output is float32 by default: all but DEFAULT, FP64 and AUTO. */
QK__PRIV int qk__prec_f32(qk_precision p) { return p != QK_PRECISION_DEFAULT && p != QK_PRECISION_FP64 && p != QK_PRECISION_AUTO; }
/* precision AUTO (and DEFAULT on the GPU engine): the fastest mode whose stated bound meets tol */


/* >>mps_prog ---- the MPS program: sites, bond bounds, steps (is a wide map MPS-able?) ---- */
/* Matrix product states for entangled maps whose gates are local (docs/mps.md). A sample's state
   is built exactly as an MPS over the qubits in a chosen order (sites), and K = |<psi(x)|psi(y)>|^2
   is a chain of transfer-matrix products, O(q chi^3) per pair instead of O(2^q).

   Bond bound. Across the bond between sites b-1 and b, the Schmidt rank of the state is at most
     - 2^min(b, q-b) (the smaller side's dimension), and
     - the product, over the circuit, of the operator Schmidt ranks of the gates crossing the bond:
       every two-qubit op of qk (CNOT, CZ, RZZ, and zz's CX-P-CX) has rank 2, and a run of
       consecutive diagonal ops (Z, RZ, P, CZ, RZZ, CX-D-CX) is one diagonal operator whose rank
       across the bond is at most 2^min(|L|, |R|), L and R the distinct qubits of its crossing pairs
       on each side. Any other op (H, X, Y, RX, RY, basis, a lone CNOT) ends the run.
   qk__mps_analyze walks the ops once and records, after every two-qubit step, this bound for each
   bond the step crosses (the "running" bound); the last values are the bond dimensions the MPS
   keeps. zz(reps=r, ent=linear) gets 2^r, circular 4^r, hea rings 4^layers (capped at the ends).
   Orders: the qubits in their own order ("natural") or folded, 0, q-1, 1, q-2, ... , which puts
   every ring pair at most two sites apart; the cheaper (sum of chi^3 over sites) is used.

   Building (exact). Every two-qubit op is a sum of two products, sum_t P_t (x) G_t, with P_t the
   projector on |t> of its first qubit: CNOT (G = I, X), CZ (I, Z), RZZ and CX-D-CX (diagonal). It
   is applied as an MPO of bond 2: the projector site, the sites between (identity on a doubled
   bond) and the other site; no factorization. Where a bond then exceeds its running bound (never
   for zz linear reps 1, at the chain's ends for reps 2), the sites touched since the last
   compression are swept: Householder QR left to right (left-orthonormal sites), then column-
   pivoted Householder QR of each site's conjugate transpose right to left, keeping the running
   bound's number of columns. With the sites outside the swept range orthonormal, the part dropped
   is the trailing block of the pivoted QR, zero in exact arithmetic because the bound is a
   theorem: what is dropped is rounding (its norm is measured, qk__mps_build's *discarded: about
   1e-15). Nothing else is ever truncated. Precision: fp64 throughout.

   Storage. The tensors of QK__NJ (8) samples are interleaved by lane: site s of group g is
   [l][a][r] entries of 8 real parts then 8 imaginary parts, with the bond dimensions of the bound
   (zero-padded where a sample's own rank is lower), so one pass of the contraction computes 8
   overlaps with vector FMAs. Overlap of row sample i with a column group: E = 1;
   per site T[l][a][r'] = sum_l' E[l][l'] B[l'][a][r'], E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r'];
   K = |E|^2 at the end. The Gram tiles, symmetric mirroring, callback / .npy output, threads,
   progress and cancel are the CPU engine's (qk__gram_job with path MPS). */
/* QK__MPS_SAT, the step kinds, qk__mps_step, qk__mps_prog: in qk_internal.h (later sources use them) */

QK__PRIV void qk__mps_prog_free(qk__mps_prog *p)
{
    if (!p) return;
    QK_FREE(p->order); QK_FREE(p->D); QK_FREE(p->off); QK_FREE(p->steps); QK_FREE(p->bounds);
    memset(p, 0, sizeof *p);
}

/* Op k and the two after it are CX(a,b) D(b) CX(a,b) with D diagonal: one diagonal two-qubit op
   (the parity rule of every engine, qk__parity_at). */
static int qk__mps_parity_at(const qk_map *m, int k) { return qk__parity_at(m->ops, m->n_ops, k); }

static int qk__mps_add_set(int *set, int *n, int qb)
{
    int i;
    if (*n > QK__MPS_SET) return 0;                 /* already "many" */
    for (i = 0; i < *n; i++) if (set[i] == qb) return 0;
    if (*n < QK__MPS_SET) set[*n] = qb;
    (*n)++;
    return 1;
}

/* The program and bounds of map m in the natural (folded = 0) or folded order. The walk stops as
   soon as a bound exceeds limit (p->chi then says by how much). QK_OK or QK_ERROR_OUT_OF_MEMORY. */
/* The lane layout and the cost of bonds D[0..q]: each site's offset in a sample's group
   (QK__NJ lanes of D[s] x 2 x D[s+1] complex), the group's size, and pair_flops. */
static void qk__mps_prog_layout(qk__mps_prog *p, int q)
{
    int64_t e = 0;
    int s;
    p->pair_flops = 0;
    for (s = 0; s < q; s++) {
        p->off[s] = e;
        e += (int64_t)p->D[s] * 2 * p->D[s + 1] * 2 * QK__NJ;
        p->pair_flops += 4.0 * 2.0 * p->D[s] * p->D[s + 1] * (double)(p->D[s] + p->D[s + 1]);
    }
    p->off[q] = e;
    p->group = e;
}

static qk_result qk__mps_analyze(const qk_map *m, int folded, int limit, qk__mps_prog *p)
{
    const int q = m->n_qubits;
    int *pos = NULL, *base = NULL, *runid = NULL, *sets = NULL, *cap = NULL, *cur;
    int64_t nb = 0, nb_cap = 0;
    int k, s, b, run = 0, stopped = 0;
    memset(p, 0, sizeof *p);
    p->q = q;
    p->folded = folded;
    p->chi = 1;
    p->order = (int *)qk__malloc(sizeof(int) * (size_t)q);
    p->D = (int *)qk__calloc((size_t)q + 1, sizeof(int));
    p->off = (int64_t *)qk__calloc((size_t)q + 1, sizeof(int64_t));
    p->steps = (qk__mps_step *)qk__malloc(sizeof(qk__mps_step) * (size_t)(m->n_ops > 0 ? m->n_ops : 1));
    pos = (int *)qk__malloc(sizeof(int) * (size_t)q);
    base = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    runid = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    cap = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    sets = (int *)qk__calloc((size_t)(q + 1) * (2 * QK__MPS_SET + 2), sizeof(int));
    if (!p->order || !p->D || !p->off || !p->steps || !pos || !base || !runid || !cap || !sets) goto oom;
    cur = p->D;
    for (s = 0; s < q; s++) {
        p->order[s] = !folded ? s : (s % 2 == 0 ? s / 2 : q - 1 - s / 2);
        pos[p->order[s]] = s;
    }
    for (b = 0; b <= q; b++) {
        int small = b < q - b ? b : q - b;
        cur[b] = 1; base[b] = 1; runid[b] = -1;
        cap[b] = small >= 30 ? QK__MPS_SAT : 1 << small;
    }
    for (k = 0; k < m->n_ops && !stopped; k++) {
        const qk_op *o = &m->ops[k];
        qk__mps_step *st = &p->steps[p->n_steps];
        int diag;
        if (o->kind == QK_OP_AMPLITUDE || o->kind == QK__OP_STATE) { p->dense = 1; p->chi = QK__MPS_SAT; break; }
        if (qk__op_arity(o->kind) == 1) {
            st->kind = 1; st->op = k; st->s0 = st->s1 = pos[o->q0];
            if (!qk__op_diag1(o->kind)) run++;
            p->n_steps++;
            continue;
        }
        st->kind = 2;
        st->op = k;
        if (qk__mps_parity_at(m, k)) { st->gate = QK__MPS_PARITY; st->op = k + 1; k += 2; }
        else st->gate = o->kind == QK_OP_CNOT ? QK__MPS_CNOT : o->kind == QK_OP_CZ ? QK__MPS_CZ : QK__MPS_RZZ;
        st->s0 = pos[o->q0] < pos[o->q1] ? pos[o->q0] : pos[o->q1];
        st->s1 = pos[o->q0] < pos[o->q1] ? pos[o->q1] : pos[o->q0];
        st->proj_left = pos[o->q0] == st->s0;
        if (st->s1 - st->s0 > p->span) p->span = st->s1 - st->s0;
        diag = st->gate != QK__MPS_CNOT;
        if (!diag) run++;
        if (nb + (st->s1 - st->s0) > nb_cap) {
            int64_t nc = nb_cap ? 2 * nb_cap : 1024;
            int *nbp;
            while (nc < nb + (st->s1 - st->s0)) nc *= 2;
            nbp = (int *)qk__realloc(p->bounds, sizeof(int) * (size_t)nc);
            if (!nbp) goto oom;
            p->bounds = nbp;
            nb_cap = nc;
        }
        st->b = nb;
        for (b = st->s0 + 1; b <= st->s1; b++) {
            if (diag) {
                int *sl = sets + (size_t)b * (2 * QK__MPS_SET + 2), *nl = sl + 2 * QK__MPS_SET, *nr = nl + 1;
                int sh;
                if (runid[b] != run) { base[b] = cur[b]; *nl = 0; *nr = 0; runid[b] = run; }
                qk__mps_add_set(sl, nl, p->order[st->s0]);
                qk__mps_add_set(sl + QK__MPS_SET, nr, p->order[st->s1]);
                sh = *nl < *nr ? *nl : *nr;
                cur[b] = (sh >= 30 || (int64_t)base[b] << sh >= cap[b]) ? cap[b] : base[b] << sh;
            } else {
                cur[b] = (int64_t)cur[b] * 2 >= cap[b] ? cap[b] : cur[b] * 2;
                runid[b] = -1;
            }
            p->bounds[nb++] = cur[b];
            if (cur[b] > p->chi) { p->chi = cur[b]; p->chi_bond = b; }
            if (cur[b] > limit) stopped = 1;
        }
        if (!diag) run++;
        p->n_steps++;
    }
    p->n_bounds = nb;
    /* lane layout and cost (meaningful when the walk finished) */
    p->D[0] = p->D[q] = 1;
    qk__mps_prog_layout(p, q);
    QK_FREE(pos); QK_FREE(base); QK_FREE(runid); QK_FREE(cap); QK_FREE(sets);
    return QK_OK;
oom:
    QK_FREE(pos); QK_FREE(base); QK_FREE(runid); QK_FREE(cap); QK_FREE(sets);
    qk__mps_prog_free(p);
    return qk__fail(QK_ERROR_OUT_OF_MEMORY, "mps: out of host memory analysing the map");
}

/* Truncation: every bound capped at max_bond (the exact bound stays in exact_chi); the lane
   layout and the cost follow the capped bonds. */
static void qk__mps_cap(qk__mps_prog *p, int max_bond, double cutoff)
{
    int s;
    int64_t k;
    p->exact_chi = p->chi;
    if (max_bond >= p->chi) max_bond = 0;   /* nothing to cap: exact (the bound is a theorem) */
    p->max_bond = max_bond;
    p->cutoff = cutoff;
    if (max_bond <= 0 || p->dense) return;
    for (k = 0; k < p->n_bounds; k++) if (p->bounds[k] > max_bond) p->bounds[k] = max_bond;
    for (s = 0; s <= p->q; s++) if (p->D[s] > max_bond) p->D[s] = max_bond;
    if (p->chi > max_bond) p->chi = max_bond;
    qk__mps_prog_layout(p, p->q);
}

/* The program of given MPS (qk_gram_mps_states): natural order, the bonds qk__mpsmap holds (the
   largest of every sample), no steps. */
static QK__NOINLINE qk_result qk__mps_given_prog(const qk_map *m, qk__mps_prog *p)
{
    const qk__mpsmap *mm = (const qk__mpsmap *)(const void *)m;
    const int q = m->n_qubits;
    int s;
    memset(p, 0, sizeof *p);
    p->q = q;
    p->given = 1;
    p->chi = 1;
    p->order = (int *)qk__malloc(sizeof(int) * (size_t)q);
    p->D = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    p->off = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)(q + 1));
    p->steps = (qk__mps_step *)qk__malloc(sizeof(qk__mps_step));
    if (!p->order || !p->D || !p->off || !p->steps) {
        qk__mps_prog_free(p);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "mps: out of host memory for the program of %d sites", q);
    }
    for (s = 0; s <= q; s++) {
        if (s < q) p->order[s] = s;
        p->D[s] = mm->D[s];
        if (p->D[s] > p->chi) { p->chi = p->D[s]; p->chi_bond = s; }
    }
    p->exact_chi = p->chi;
    qk__mps_prog_layout(p, q);
    return QK_OK;
}

/* The MPS program of an entangled map: the cheaper of the two orders (ties: the smaller span,
   then natural). p->chi > QK_MPS_MAX_BOND or p->dense: not MPS-able. max_bond > 0 caps every
   bond (truncation), cutoff > 0 drops small Schmidt values (both: qk_gram_desc). */
QK__PRIV qk_result qk__mps_prog_make_t(const qk_map *m, int max_bond, double cutoff, qk__mps_prog *p)
{
    qk__mps_prog f;
    const int limit = max_bond > 0 ? QK__MPS_SAT : QK_MPS_MAX_BOND;
    qk_result r;
    if (qk__map_is_mps(m)) return qk__mps_given_prog(m, p);   /* given MPS: no truncation (gram.c refuses it) */
    r = qk__mps_analyze(m, 0, limit, p);
    if (r != QK_OK) return r;
    qk__mps_cap(p, max_bond, cutoff);
    if (p->dense || m->n_qubits < 3) return r;
    r = qk__mps_analyze(m, 1, limit, &f);
    if (r != QK_OK) { qk__mps_prog_free(p); return r; }
    qk__mps_cap(&f, max_bond, cutoff);
    if (f.chi <= QK_MPS_MAX_BOND &&
        (p->chi > QK_MPS_MAX_BOND || f.pair_flops < p->pair_flops || (f.pair_flops == p->pair_flops && f.span < p->span))) {
        qk__mps_prog_free(p);
        *p = f;
    } else {
        qk__mps_prog_free(&f);
    }
    return QK_OK;
}

QK__PRIV qk_result qk__mps_prog_make(const qk_map *m, qk__mps_prog *p) { return qk__mps_prog_make_t(m, 0, 0.0, p); }

/* For qk_map_make: an entangled map beyond QK_MAX_STATE_QUBITS is kept when it is MPS-able.
   Returns its bond bound (> QK_MPS_MAX_BOND: not MPS-able). */
QK__PRIV int qk__mps_bond_of(const qk_map *m)
{
    qk__mps_prog p;
    int chi;
    if (qk__mps_prog_make(m, &p) != QK_OK) return QK__MPS_SAT;
    chi = p.dense ? QK__MPS_SAT : p.chi;
    qk__mps_prog_free(&p);
    return chi;
}
/* >>maps_impl ---- maps, angles, data checks ---- */
#include <float.h>

/* Numbers in C syntax whatever the locale. A program that calls setlocale(LC_ALL, "de_DE.UTF-8")
   makes strtod expect "0,5" and printf write it: qk reads and writes '.' all the same. Reading:
   qk__num_len scans a C-syntax number ([+-] digits [. digits] [(e|E) [+-] digits], or inf /
   infinity / nan where allowed), whose '.' is then replaced by the locale's decimal point and
   handed to strtod, which rounds correctly (any length: long numbers go through the heap).
   Writing: qk__fmt_g prints with %g and puts '.' back. The locale's decimal point is found by
   printing 1.5 (snprintf is reentrant where localeconv is not). */
/* qk__radix: in qk_internal.h */

QK__PRIV void qk__radix_init(qk__radix *r)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%.1f", 1.5);
    r->s[0] = '.';
    r->s[1] = 0;
    r->n = 1;
    /* "1" + decimal point + "5" */
    if (n >= 3 && b[0] == '1' && b[n - 1] == '5' && (size_t)(n - 2) < sizeof r->s) {
        memcpy(r->s, b + 1, (size_t)(n - 2));
        r->n = (size_t)(n - 2);
        r->s[r->n] = 0;
    }
}

/* %.*g of v with '.' as the decimal point, into buf; returns buf. */
QK__PRIV const char *qk__fmt_g(char *buf, size_t size, double v, int prec)
{
    qk__radix rx;
    char tmp[64], *dp;
    size_t n;
    qk__radix_init(&rx);
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (!(rx.n == 1 && rx.s[0] == '.') && (dp = strstr(tmp, rx.s)) != NULL) {
        *dp = '.';
        memmove(dp + 1, dp + rx.n, strlen(dp + rx.n) + 1);
    }
    n = strlen(tmp);
    if (size) {
        if (n >= size) n = size - 1;
        memcpy(buf, tmp, n);
        buf[n] = 0;
    }
    return buf;
}

/* An angle as the spec parser reads it back (qk_map_spec, error messages). */
QK__PRIV int qk__fmt_angle(const qk_angle *a, char *buf, size_t size)
{
    char off[40] = "", sc[40];
    if (a->kind == QK_ARG_CONST) return snprintf(buf, size, "%s", qk__fmt_g(sc, sizeof sc, a->offset, 17));
    if (a->offset != 0.0) {
        off[0] = '+';
        qk__fmt_g(off + (a->offset < 0 ? 0 : 1), sizeof off - 1, a->offset, 17);
    }
    qk__fmt_g(sc, sizeof sc, a->scale, 17);
    switch (a->kind) {
    case QK_ARG_X: return snprintf(buf, size, "%s*x%d%s", sc, a->x0, off);
    case QK_ARG_XX: return snprintf(buf, size, "%s*x%d*x%d%s", sc, a->x0, a->x1, off);
    case QK_ARG_PIXX: return snprintf(buf, size, "%s*(pi-x%d)*(pi-x%d)%s", sc, a->x0, a->x1, off);
    case QK_ARG_W: return snprintf(buf, size, "%s*w%d%s", sc, a->w, off);
    case QK_ARG_WX: return snprintf(buf, size, "%s*w%d*x%d%s", sc, a->w, a->x0, off);
    default: return snprintf(buf, size, "0");
    }
}

QK__PRIV int qk__ci_eq(const char *s, size_t n, const char *word)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!word[i] || tolower((unsigned char)s[i]) != word[i]) return 0;
    return word[n] == 0;
}

/* Length of the C-syntax number at the start of s (n bytes), 0 when there is none. special:
   also inf, infinity, nan (any case, after an optional sign). */
QK__PRIV size_t qk__num_len(const char *s, size_t n, int special)
{
    size_t i = 0, digits = 0, k;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (special) {
        static const char *words[] = {"infinity", "inf", "nan"};
        for (k = 0; k < 3; k++) {
            size_t wl = strlen(words[k]);
            if (n - i >= wl && qk__ci_eq(s + i, wl, words[k]) && (n - i == wl || !isalnum((unsigned char)s[i + wl])))
                return i + wl;
        }
    }
    while (i < n && isdigit((unsigned char)s[i])) { i++; digits++; }
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && isdigit((unsigned char)s[i])) { i++; digits++; }
    }
    if (!digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && isdigit((unsigned char)s[j])) {
            while (j < n && isdigit((unsigned char)s[j])) j++;
            i = j;
        }
    }
    return i;
}

/* Converts the n bytes at s, a whole qk__num_len token, to *v (an out-of-range value becomes
   +-Inf, as strtod makes it). Returns 1, or 0 when out of memory (a token over 255 bytes). */
QK__PRIV int qk__strtod_c(const char *s, size_t n, const qk__radix *rx, double *v)
{
    char small[256], *buf = small, *end;
    size_t i, k = 0, need = n + (rx->n - 1) + 1;
    if (need > sizeof small) {
        buf = (char *)QK_MALLOC(need);
        if (!buf) return 0;
    }
    for (i = 0; i < n; i++) {
        if (s[i] == '.') { memcpy(buf + k, rx->s, rx->n); k += rx->n; }
        else buf[k++] = s[i];
    }
    buf[k] = 0;
    *v = strtod(buf, &end);
    if (buf != small) QK_FREE(buf);
    return 1;
}



/* qk__ops: in qk_internal.h */

QK__PRIV void qk__push(qk__ops *l, qk_op_kind kind, int q0, int q1, qk_angle a)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        qk_op *p = (qk_op *)qk__realloc(l->ops, (size_t)cap * sizeof(qk_op));
        if (!p) { l->oom = 1; return; }
        l->ops = p;
        l->cap = cap;
    }
    l->ops[l->n].kind = kind;
    l->ops[l->n].q0 = q0;
    l->ops[l->n].q1 = q1;
    l->ops[l->n].angle = a;
    l->n++;
}

QK__PRIV qk_angle qk__ang(qk_arg_kind kind, int x0, int x1, int w, double scale, double offset)
{
    qk_angle a;
    a.kind = kind; a.x0 = x0; a.x1 = x1; a.w = w; a.scale = scale; a.offset = offset;
    return a;
}
QK__PRIV qk_angle qk__noang(void) { return qk__ang(QK_ARG_CONST, 0, 0, 0, 1.0, 0.0); }


/* Entangling pairs of rep r for a pattern (Qiskit's get_entangler_map for 2-qubit blocks). */
static int qk__pairs(qk_entanglement ent, int q, int rep, int (*pairs)[2], int max)
{
    int n = 0, i, j;
#define QK__PAIR(a, b) do { if (n < max) { pairs[n][0] = (a); pairs[n][1] = (b); } n++; } while (0)
    if (q < 2) return 0;
    switch (ent) {
    case QK_ENT_LINEAR:
        for (i = 0; i + 1 < q; i++) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_REVERSE_LINEAR:
        for (i = q - 2; i >= 0; i--) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_CIRCULAR:
        if (q > 2) QK__PAIR(q - 1, 0);
        for (i = 0; i + 1 < q; i++) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_PAIRWISE:
        for (i = 0; i + 1 < q; i += 2) QK__PAIR(i, i + 1);
        for (i = 1; i + 1 < q; i += 2) QK__PAIR(i, i + 1);
        break;
    case QK_ENT_SCA: {
        /* shifted circular alternating: the circular list rotated by rep, pairs flipped on odd
           reps. The zz blocks are diagonal and commute, so only the set of pairs changes states. */
        int c = (q > 2) ? q : q - 1, k;
        for (k = 0; k < c; k++) {
            int idx = ((k - rep) % c + c) % c, a, b;
            if (q > 2) { a = idx == 0 ? q - 1 : idx - 1; b = idx == 0 ? 0 : idx; }
            else { a = idx; b = idx + 1; }
            if (rep % 2 == 1) QK__PAIR(b, a); else QK__PAIR(a, b);
        }
        break;
    }
    case QK_ENT_FULL:
    case QK_ENT_DEFAULT:
    default:
        for (i = 0; i < q; i++)
            for (j = i + 1; j < q; j++) QK__PAIR(i, j);
        break;
    }
#undef QK__PAIR
    return n;
}

static qk_map_class qk__classify(const qk_op *ops, int n)
{
    int i, entangled = 0, real = 1;
    for (i = 0; i < n; i++) {
        switch (ops[i].kind) {
        case QK_OP_CNOT: case QK_OP_CZ: case QK_OP_RZZ: case QK_OP_AMPLITUDE: entangled = 1; break;
        default: break;
        }
        switch (ops[i].kind) {
        case QK_OP_H: case QK_OP_X: case QK_OP_Z: case QK_OP_RY: case QK_OP_CNOT: case QK_OP_CZ:
        case QK_OP_AMPLITUDE: case QK_OP_BASIS: break;
        default: real = 0; break;
        }
    }
    if (!entangled) return QK_CLASS_PRODUCT;
    return real ? QK_CLASS_REAL : QK_CLASS_COMPLEX;
}

QKDEF const char *qk_map_class_string(qk_map_class c)
{
    switch (c) {
    case QK_CLASS_PRODUCT: return "product (analytic)";
    case QK_CLASS_REAL: return "real";
    case QK_CLASS_COMPLEX: return "complex";
    default: return "?";
    }
}

static qk_result qk__validate_ops(const qk_op *ops, int n_ops, int q, int d, int nw)
{
    int i;
    for (i = 0; i < n_ops; i++) {
        const qk_op *o = &ops[i];
        int ar;
        if (o->kind < QK_OP_H || o->kind >= QK_OP_KIND_COUNT_)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: unknown op kind %d", i, (int)o->kind);
        ar = qk__op_arity(o->kind);
        if (o->kind == QK_OP_AMPLITUDE) {
            if (i != 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: amplitude encoding must be the first op", i);
            if (q < 31 && (int64_t)d > ((int64_t)1 << q))
                return qk__fail(QK_ERROR_SHAPE, "amplitude encoding of %d features needs at least %d qubits, map has %d", d, (int)ceil(log2((double)d)), q);
            continue;
        }
        if (ar >= 1 && (o->q0 < 0 || o->q0 >= q))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: qubit %d out of range [0, %d)", i, o->q0, q);
        if (ar == 2 && (o->q1 < 0 || o->q1 >= q || o->q1 == o->q0))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: second qubit %d invalid (range [0, %d), distinct from %d)", i, o->q1, q, o->q0);
        if (o->kind == QK_OP_BASIS) {
            if (o->angle.x0 < 0 || o->angle.x0 >= d)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: basis feature x%d out of range [0, %d)", i, o->angle.x0, d);
            continue;
        }
        if (!qk__op_has_angle(o->kind)) continue;
        if (!isfinite(o->angle.scale) || !isfinite(o->angle.offset))
            return qk__fail(QK_ERROR_NON_FINITE, "op %d: angle scale/offset not finite", i);
        switch (o->angle.kind) {
        case QK_ARG_CONST: break;
        case QK_ARG_X:
            if (o->angle.x0 < 0 || o->angle.x0 >= d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d out of range [0, %d)", i, o->angle.x0, d);
            break;
        case QK_ARG_XX: case QK_ARG_PIXX:
            if (o->angle.x0 < 0 || o->angle.x0 >= d || o->angle.x1 < 0 || o->angle.x1 >= d)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d or x%d out of range [0, %d)", i, o->angle.x0, o->angle.x1, d);
            break;
        case QK_ARG_WX: case QK_ARG_W:   /* (no fall-through: a comment that says so is gone where nvcc compiles qk.h) */
            if (o->angle.kind == QK_ARG_WX && (o->angle.x0 < 0 || o->angle.x0 >= d))
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: feature x%d out of range [0, %d)", i, o->angle.x0, d);
            if (o->angle.w < 0 || o->angle.w >= nw) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: weight w%d out of range [0, %d)", i, o->angle.w, nw);
            break;
        default:
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "op %d: unknown angle kind %d", i, (int)o->angle.kind);
        }
    }
    return QK_OK;
}

/* The resource bounds (QK_MAX_REPS, QK_MAX_OPS, QK_MAX_WEIGHTS, the state-qubit limit of
   entangling built-ins), checked on the resolved desc before anything is allocated. The op
   count is computed the way the builders below push ops (q <= QK_MAX_STATE_QUBITS keeps the
   pair counting cheap). */
static qk_result qk__map_bounds(const qk_map_desc *d)
{
    static const char *names[] = {"?", "zz", "iqp", "angle", "amplitude", "basis", "hea", "circuit"};
    const char *nm = names[(int)d->type >= 0 && (int)d->type <= QK_MAP_CUSTOM ? (int)d->type : 0];
    int q = d->n_qubits, rep;
    int64_t ops = 0, nw = 0;
    int reps = d->reps ? d->reps : (d->type == QK_MAP_IQP ? 1 : 2);
    int entangling = d->type == QK_MAP_AMPLITUDE ||
                     (q >= 2 && (d->type == QK_MAP_ZZ || d->type == QK_MAP_IQP || d->type == QK_MAP_HEA));
    /* zz with a local pattern and hea rings may take the MPS path beyond the statevector (their
       bound is checked once the ops are built); all-to-all and dense maps never can */
    int local = (d->type == QK_MAP_ZZ && d->ent != QK_ENT_FULL) || d->type == QK_MAP_HEA;
    if (entangling && q > QK_MAX_STATE_QUBITS && !local)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %s of %d qubits exceeds the state limit of %d qubits "
                        "(QK_MAX_STATE_QUBITS; beyond, only product maps and local maps on the MPS path: docs/mps.md)", nm, q, QK_MAX_STATE_QUBITS);
    if ((d->type == QK_MAP_ZZ || d->type == QK_MAP_IQP || d->type == QK_MAP_HEA) && reps > QK_MAX_REPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s with %s=%d exceeds QK_MAX_REPS (%d)", nm,
                        d->type == QK_MAP_HEA ? "layers" : "reps", reps, QK_MAX_REPS);
    switch (d->type) {
    case QK_MAP_ZZ:
        for (rep = 0; rep < reps; rep++) ops += 2 * (int64_t)q + 3 * (int64_t)qk__pairs(d->ent, q, rep, NULL, 0);
        break;
    case QK_MAP_IQP: ops = (int64_t)reps * (2 * (int64_t)q + (int64_t)q * (q - 1) / 2); break;
    case QK_MAP_ANGLE: case QK_MAP_BASIS: ops = q; break;
    case QK_MAP_AMPLITUDE: ops = 1; break;
    case QK_MAP_HEA: {
        int per = (d->rot == 'z' || d->rot == 'Z') ? 2 : 1;
        ops = (int64_t)reps * ((int64_t)per * q + (q == 2 ? 1 : q >= 3 ? q : 0));
        nw = (int64_t)reps * q * per;
        break;
    }
    case QK_MAP_CUSTOM: ops = d->n_ops; nw = d->n_weights; break;
    default: break;
    }
    if (ops > QK_MAX_OPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s of %d qubits would have %lld ops, more than QK_MAX_OPS (%d)",
                        nm, q, (long long)ops, (int)QK_MAX_OPS);
    if (nw > QK_MAX_WEIGHTS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: %s would have %lld weights, more than QK_MAX_WEIGHTS (%d)",
                        nm, (long long)nw, (int)QK_MAX_WEIGHTS);
    return QK_OK;
}


/* Fills the desc's defaults (type, qubits, alpha, entanglement) and checks its shape and
   resource bounds: everything a builder may rely on. */
static qk_result qk__map_resolve(qk_map_desc *d)
{
    d->type = d->type ? d->type : QK_MAP_ZZ;
    if (d->n_features <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: n_features must be > 0 (got %d)", d->n_features);
    if (d->n_qubits < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: n_qubits must be >= 0 (got %d)", d->n_qubits);
    if (d->reps < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: reps must be >= 0 (got %d)", d->reps);
    if (d->type == QK_MAP_AMPLITUDE) {
        int need = 0;
        while (need < 62 && ((int64_t)1 << need) < (int64_t)d->n_features) need++;
        if (need == 0) need = 1;
        d->n_qubits = qk__def_i(d->n_qubits, need);
        if (d->n_qubits < need) return qk__fail(QK_ERROR_SHAPE, "amplitude: %d features need at least %d qubits (qubits=%d)", d->n_features, need, d->n_qubits);
    } else if (d->type == QK_MAP_CUSTOM) {
        if (d->n_qubits <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: n_qubits must be > 0");
    } else {
        d->n_qubits = qk__def_i(d->n_qubits, d->n_features);
        if (d->type != QK_MAP_HEA && d->n_qubits != d->n_features)
            return qk__fail(QK_ERROR_SHAPE, "map: this map uses one qubit per feature (qubits=%d, features=%d)", d->n_qubits, d->n_features);
    }
    if (d->n_qubits > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %d qubits exceed QK_MAX_PRODUCT_QUBITS (%d)", d->n_qubits, QK_MAX_PRODUCT_QUBITS);
    d->alpha = qk__def_d(d->alpha, 2.0);
    if (!isfinite(d->alpha)) return qk__fail(QK_ERROR_NON_FINITE, "zz: alpha is not finite");
    d->ent = d->ent ? d->ent : QK_ENT_FULL;
    if (d->ent < QK_ENT_FULL || d->ent > QK_ENT_SCA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: unknown entanglement %d", (int)d->ent);
    return qk__map_bounds(d);
}

/* The builders, one per map type: each takes the resolved desc (and fills the defaults that are
   its own: reps, rot), pushes the op list into *l (l->oom on a failed allocation) and sets *nw,
   the number of weights. */

/* Qiskit ZZFeatureMap: per rep, H and P(alpha x_i) on every qubit, then CNOT,
   P(alpha (pi - x_a)(pi - x_b)), CNOT on each pair of the entanglement pattern. */
static qk_result qk__map_zz(qk_map_desc *d, qk__ops *l, int *nw)
{
    int q = d->n_qubits, rep, i, k;
    d->reps = qk__def_i(d->reps, 2);
    *nw = 0;
    for (rep = 0; rep < d->reps; rep++) {
        int np = qk__pairs(d->ent, q, rep, NULL, 0);
        int (*pairs)[2] = (int (*)[2])qk__malloc(sizeof(int[2]) * (size_t)(np > 0 ? np : 1));
        if (!pairs) { l->oom = 1; break; }
        qk__pairs(d->ent, q, rep, pairs, np);
        for (i = 0; i < q; i++) qk__push(l, QK_OP_H, i, 0, qk__noang());
        for (i = 0; i < q; i++) qk__push(l, QK_OP_P, i, 0, qk__ang(QK_ARG_X, i, 0, 0, d->alpha, 0.0));
        for (k = 0; k < np; k++) {
            int a = pairs[k][0], b = pairs[k][1];
            qk__push(l, QK_OP_CNOT, a, b, qk__noang());
            qk__push(l, QK_OP_P, b, 0, qk__ang(QK_ARG_PIXX, a, b, 0, d->alpha, 0.0));
            qk__push(l, QK_OP_CNOT, a, b, qk__noang());
        }
        QK_FREE(pairs);
    }
    return QK_OK;
}

/* PennyLane IQPEmbedding: per rep, H and RZ(x_i) on every qubit, RZZ(x_i x_j) on every pair. */
static qk_result qk__map_iqp(qk_map_desc *d, qk__ops *l, int *nw)
{
    int q = d->n_qubits, rep, i, j;
    d->reps = qk__def_i(d->reps, 1);
    *nw = 0;
    for (rep = 0; rep < d->reps; rep++) {
        for (i = 0; i < q; i++) qk__push(l, QK_OP_H, i, 0, qk__noang());
        for (i = 0; i < q; i++) qk__push(l, QK_OP_RZ, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
        for (i = 0; i < q; i++)
            for (j = i + 1; j < q; j++) qk__push(l, QK_OP_RZZ, i, j, qk__ang(QK_ARG_XX, i, j, 0, 1.0, 0.0));
    }
    return QK_OK;
}

/* PennyLane AngleEmbedding: R_rot(x_i) on qubit i. */
static qk_result qk__map_angle(qk_map_desc *d, qk__ops *l, int *nw)
{
    qk_op_kind k;
    char rot = d->rot ? (char)tolower((unsigned char)d->rot) : 'x';
    int i;
    if (rot != 'x' && rot != 'y' && rot != 'z') return qk__fail(QK_ERROR_INVALID_ARGUMENT, "angle: rotation must be x, y or z (got '%c')", d->rot);
    d->rot = rot;
    *nw = 0;
    k = rot == 'x' ? QK_OP_RX : rot == 'y' ? QK_OP_RY : QK_OP_RZ;
    for (i = 0; i < d->n_qubits; i++) qk__push(l, k, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
    return QK_OK;
}

/* PennyLane AmplitudeEmbedding: one op that loads the normalised, zero-padded features. */
static qk_result qk__map_amplitude(qk_map_desc *d, qk__ops *l, int *nw)
{
    (void)d;
    *nw = 0;
    qk__push(l, QK_OP_AMPLITUDE, 0, 0, qk__noang());
    return QK_OK;
}

/* PennyLane BasisEmbedding: qubit i flipped where feature i is 1. */
static qk_result qk__map_basis(qk_map_desc *d, qk__ops *l, int *nw)
{
    int i;
    *nw = 0;
    for (i = 0; i < d->n_qubits; i++) qk__push(l, QK_OP_BASIS, i, 0, qk__ang(QK_ARG_X, i, 0, 0, 1.0, 0.0));
    return QK_OK;
}

/* Hardware-efficient ansatz with data re-uploading: per layer, RY(w x) (then RZ(w x) for rot z)
   on every qubit, then a CZ (or CNOT) ring. */
static qk_result qk__map_hea(qk_map_desc *d, qk__ops *l, int *nw)
{
    char rot = d->rot ? (char)tolower((unsigned char)d->rot) : 'y';
    int q = d->n_qubits, per, rep, i;
    if (rot != 'y' && rot != 'z') return qk__fail(QK_ERROR_INVALID_ARGUMENT, "hea: rot must be y or yz (got '%c')", d->rot);
    d->rot = rot;
    d->reps = qk__def_i(d->reps, 2);
    if (d->cnot != 0 && d->cnot != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "hea: cnot must be 0 (CZ ring) or 1 (CNOT ring)");
    per = rot == 'y' ? 1 : 2;
    *nw = d->reps * q * per;
    for (rep = 0; rep < d->reps; rep++) {
        for (i = 0; i < q; i++) {
            int w0 = per * (rep * q + i);
            qk__push(l, QK_OP_RY, i, 0, qk__ang(QK_ARG_WX, i % d->n_features, 0, w0, 1.0, 0.0));
            if (per == 2) qk__push(l, QK_OP_RZ, i, 0, qk__ang(QK_ARG_WX, i % d->n_features, 0, w0 + 1, 1.0, 0.0));
        }
        if (q == 2) qk__push(l, d->cnot ? QK_OP_CNOT : QK_OP_CZ, 0, 1, qk__noang());
        if (q >= 3)
            for (i = 0; i < q; i++) qk__push(l, d->cnot ? QK_OP_CNOT : QK_OP_CZ, i, (i + 1) % q, qk__noang());
    }
    return QK_OK;
}

/* The caller's op list, copied (qk__validate_ops checks it afterwards). */
static qk_result qk__map_custom(qk_map_desc *d, qk__ops *l, int *nw)
{
    int i;
    if (d->n_ops < 0 || (d->n_ops > 0 && !d->ops)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: ops is NULL or n_ops < 0");
    if (d->n_weights < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "custom map: n_weights < 0");
    *nw = d->n_weights;
    for (i = 0; i < d->n_ops; i++) qk__push(l, d->ops[i].kind, d->ops[i].q0, d->ops[i].q1, d->ops[i].angle);
    return QK_OK;
}

/* The map that takes over the validated op list l->ops (freed here on failure): its class, the
   MPS bound of an entangled map beyond the statevector, nw weights of 1, the resolved desc. */
static qk_result qk__map_new(qk_map_desc *d, qk__ops *l, int nw, qk_map **out)
{
    int q = d->n_qubits, i;
    qk_map *m = (qk_map *)qk__calloc(1, sizeof *m);
    if (!m) { QK_FREE(l->ops); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory"); }
    m->type = d->type;
    m->n_qubits = q;
    m->n_features = d->n_features;
    m->n_weights = nw;
    m->n_ops = l->n;
    m->ops = l->ops;
    m->cls = qk__classify(l->ops, l->n);
    if (m->cls != QK_CLASS_PRODUCT && q > QK_MAX_STATE_QUBITS) {
        int chi = qk__mps_bond_of(m);   /* beyond the statevector: MPS-able maps only */
        if (chi > QK_MPS_MAX_BOND) {
            qk_map_free(m);
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "map: %d qubits with entangling ops exceed the state limit of %d qubits, and the "
                            "map's bond dimension bound (%s%d) exceeds QK_MPS_MAX_BOND = %d for the MPS path (docs/mps.md)",
                            q, QK_MAX_STATE_QUBITS, chi >= (1 << 30) ? ">= " : "", chi, QK_MPS_MAX_BOND);
        }
    }
    m->weights = (double *)qk__malloc(sizeof(double) * (size_t)(nw > 0 ? nw : 1));
    if (!m->weights) { qk_map_free(m); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory"); }
    for (i = 0; i < nw; i++) m->weights[i] = 1.0;
    d->ops = NULL;
    d->n_ops = l->n;
    d->n_weights = nw;
    m->desc = *d;
    *out = m;
    return QK_OK;
}

/* Resolves and checks the desc, builds the op list with the type's builder, validates it, then
   makes the map (class, MPS bound, weights). */
QKDEF qk_result qk_map_make(const qk_map_desc *desc_in, qk_map **out)
{
    qk_map_desc d;
    qk__ops l;
    qk_result r;
    int nw = 0;
    if (!desc_in || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_make: NULL %s", desc_in ? "out" : "desc");
    *out = NULL;
    d = *desc_in;
    memset(&l, 0, sizeof l);
    if ((r = qk__map_resolve(&d)) != QK_OK) return r;
    switch (d.type) {
    case QK_MAP_ZZ: r = qk__map_zz(&d, &l, &nw); break;
    case QK_MAP_IQP: r = qk__map_iqp(&d, &l, &nw); break;
    case QK_MAP_ANGLE: r = qk__map_angle(&d, &l, &nw); break;
    case QK_MAP_AMPLITUDE: r = qk__map_amplitude(&d, &l, &nw); break;
    case QK_MAP_BASIS: r = qk__map_basis(&d, &l, &nw); break;
    case QK_MAP_HEA: r = qk__map_hea(&d, &l, &nw); break;
    case QK_MAP_CUSTOM: r = qk__map_custom(&d, &l, &nw); break;
    default: return qk__fail(QK_ERROR_INVALID_ARGUMENT, "map: unknown type %d", (int)d.type);
    }
    if (r == QK_OK && l.oom) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "map: out of memory building the op list");
    if (r == QK_OK) r = qk__validate_ops(l.ops, l.n, d.n_qubits, d.n_features, nw);
    if (r != QK_OK) { QK_FREE(l.ops); return r; }
    return qk__map_new(&d, &l, nw, out);
}

QKDEF void qk_map_free(qk_map *map)
{
    if (!map) return;
    QK_FREE(map->ops);
    QK_FREE(map->weights);
    QK_FREE(map);
}

QKDEF qk_result qk_map_set_weights(qk_map *map, const double *w, int n)
{
    int i;
    if (!map) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_set_weights: map is NULL");
    if (n != map->n_weights) return qk__fail(QK_ERROR_SHAPE, "map takes %d weights, got %d", map->n_weights, n);
    if (n > 0 && !w) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_set_weights: w is NULL");
    for (i = 0; i < n; i++)
        if (!isfinite(w[i])) return qk__fail(QK_ERROR_NON_FINITE, "weight w%d is %s", i, isnan(w[i]) ? "NaN" : "Inf");
    if (n > 0) memcpy(map->weights, w, sizeof(double) * (size_t)n);
    return QK_OK;
}

QKDEF void qk_map_angles(const qk_map *map, const double *x, double *theta)
{
    int i;
    for (i = 0; i < map->n_ops; i++)
        theta[i] = qk__op_has_angle(map->ops[i].kind) ? qk__angle_value(&map->ops[i].angle, x, map->weights) : 0.0;
}

static const char *qk__op_name(qk_op_kind k)
{
    static const char *names[] = {"?", "h", "x", "y", "z", "rx", "ry", "rz", "p", "cx", "cz", "rzz", "amplitude", "basis"};
    return (int)k > 0 && (int)k < QK_OP_KIND_COUNT_ ? names[k] : "?";
}

/* "x3 = X[17][3] = 1e+300" for each feature (and weight) an angle reads, into buf. */
static void qk__angle_inputs(const qk_angle *a, const double *row, const double *w, const char *name, int64_t i,
                             char *buf, size_t size)
{
    char v0[40], v1[40];
    buf[0] = 0;
    switch (a->kind) {
    case QK_ARG_X:
        snprintf(buf, size, "x%d = %s[%lld][%d] = %s", a->x0, name, (long long)i, a->x0, qk__fmt_g(v0, sizeof v0, row[a->x0], 6));
        break;
    case QK_ARG_XX: case QK_ARG_PIXX:
        snprintf(buf, size, "x%d = %s[%lld][%d] = %s, x%d = %s[%lld][%d] = %s", a->x0, name, (long long)i, a->x0,
                 qk__fmt_g(v0, sizeof v0, row[a->x0], 6), a->x1, name, (long long)i, a->x1, qk__fmt_g(v1, sizeof v1, row[a->x1], 6));
        break;
    case QK_ARG_WX:
        snprintf(buf, size, "w%d = %s, x%d = %s[%lld][%d] = %s", a->w, qk__fmt_g(v1, sizeof v1, w[a->w], 6), a->x0, name,
                 (long long)i, a->x0, qk__fmt_g(v0, sizeof v0, row[a->x0], 6));
        break;
    case QK_ARG_W:
        snprintf(buf, size, "w%d = %s", a->w, qk__fmt_g(v1, sizeof v1, w[a->w], 6));
        break;
    default:
        snprintf(buf, size, "constants only");
        break;
    }
}

/* 1 when no op's angle can exceed QK_MAX_ABS_ANGLE for features of magnitude at most xmax
   (a bound: |scale| |f| + |offset| with |f| bounded per kind; weights are the map's). */
static int qk__angles_bounded(const qk_map *map, double xmax)
{
    int k;
    for (k = 0; k < map->n_ops; k++) {
        const qk_angle *a = &map->ops[k].angle;
        double f, w;
        if (!qk__op_has_angle(map->ops[k].kind)) continue;
        w = (a->kind == QK_ARG_W || a->kind == QK_ARG_WX) ? fabs(map->weights[a->w]) : 0.0;
        switch (a->kind) {
        case QK_ARG_X: f = xmax; break;
        case QK_ARG_XX: f = xmax * xmax; break;
        case QK_ARG_PIXX: f = (QK__PI + xmax) * (QK__PI + xmax); break;
        case QK_ARG_W: f = w; break;
        case QK_ARG_WX: f = w * xmax; break;
        default: f = 0.0; break;
        }
        if (!(fabs(a->scale) * f + fabs(a->offset) <= 0.5 * QK_MAX_ABS_ANGLE)) return 0;
    }
    return 1;
}

/* A given state's squared norm ss (NaN: a non-finite amplitude): finite, non-zero, and within
   norm_tol of 1 unless the states are to be scaled. */
QK__PRIV qk_result qk__state_norm_check(const qk__smap *sm, double ss, int side, int64_t row)
{
    const char *nm = side ? "B" : "A";
    if (isnan(ss)) return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: an amplitude is NaN or Inf", nm, (long long)row);
    if (!isfinite(ss) || ss < DBL_MIN)
        return qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the state's squared norm is %s%s", nm, (long long)row,
                        ss == 0.0 ? "0" : isfinite(ss) ? "below DBL_MIN" : "not finite", ss == 0.0 ? " (a zero state)" : "");
    if (!(sm->op.q1 & QK__STATE_NORMALIZE) && !(fabs(ss - 1.0) <= sm->in.norm_tol)) {
        char v0[40], v1[40];
        return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the state's squared norm is %s, off 1 by more than norm_tol %s "
                        "(normalize = 1 scales each state to norm 1)", nm, (long long)row,
                        qk__fmt_g(v0, sizeof v0, ss, 17), qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
    }
    return QK_OK;
}

/* Given states (qk_gram_states): rows [row0, row0 + n) of side (0: A, 1: B), ld_bytes apart:
   every amplitude finite, and the norm within norm_tol of 1 (or, to be scaled, non-zero). */
QK__PRIV qk_result qk__states_check(const qk__smap *sm, const void *rows, int64_t n, int64_t ld_bytes, int side, int64_t row0)
{
    const int type = sm->in.type;
    const int64_t dim = sm->in.dim;
    const char *nm = side ? "B" : "A";
    int64_t i, k;
    if (sm->op.q1 & QK__STATE_MIXED) {   /* density matrices: finite, Hermitian, positive trace, entries at most it, unit trace */
        for (i = 0; i < n; i++) {
            const void *row = (const char *)rows + i * ld_bytes;
            double tr = 0.0, re, im, re2, im2, mx = 0.0;
            int64_t a, b, kmx = 0;
            for (k = 0; k < dim * dim; k++) {
                qk__state_amp(row, type, k, &re, &im);
                if (!isfinite(re) || !isfinite(im))
                    return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: entry (%lld, %lld) of the density matrix is %s", nm, (long long)(row0 + i),
                                    (long long)(k / dim), (long long)(k % dim), isnan(re) || isnan(im) ? "NaN" : "Inf");
                if (re * re + im * im > mx) { mx = re * re + im * im; kmx = k; }
            }
            for (a = 0; a < dim; a++) {
                for (b = a; b < dim; b++) {
                    qk__state_amp(row, type, a * dim + b, &re, &im);
                    qk__state_amp(row, type, b * dim + a, &re2, &im2);
                    if (fabs(re - re2) > sm->in.norm_tol || fabs(im + im2) > sm->in.norm_tol) {
                        char v0[40];
                        return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix is not Hermitian: entries (%lld, %lld) and "
                                        "(%lld, %lld) differ from conjugates by more than norm_tol %s", nm, (long long)(row0 + i),
                                        (long long)a, (long long)b, (long long)b, (long long)a, qk__fmt_g(v0, sizeof v0, sm->in.norm_tol, 3));
                    }
                }
                qk__state_amp(row, type, a * dim + a, &re, &im);
                tr += re;
            }
            if (!(tr > DBL_MIN)) {
                char v0[40];
                return qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the density matrix's trace is %s (not positive)", nm, (long long)(row0 + i),
                                qk__fmt_g(v0, sizeof v0, tr, 17));
            }
            if (!(sqrt(mx) <= tr * (1.0 + sm->in.norm_tol))) {
                char v0[40], v1[40];
                return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: entry (%lld, %lld) of the density matrix has magnitude %s, more than its "
                                "trace %s: not a density matrix (a positive matrix's entries are at most its trace)", nm,
                                (long long)(row0 + i), (long long)(kmx / dim), (long long)(kmx % dim), qk__fmt_g(v0, sizeof v0, sqrt(mx), 6),
                                qk__fmt_g(v1, sizeof v1, tr, 6));
            }
            if ((sm->op.q1 & QK__STATE_NORMALIZE) == 0 && !(fabs(tr - 1.0) <= sm->in.norm_tol)) {
                char v0[40], v1[40];
                return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix's trace is %s, off 1 by more than norm_tol %s "
                                "(normalize = 1 divides by it)", nm, (long long)(row0 + i), qk__fmt_g(v0, sizeof v0, tr, 17),
                                qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
            }
        }
        return QK_OK;
    }
    for (i = 0; i < n; i++) {
        const void *row = (const char *)rows + i * ld_bytes;
        double ss = 0.0, re, im;
        for (k = 0; k < dim; k++) {
            qk__state_amp(row, type, k, &re, &im);
            if (!isfinite(re) || !isfinite(im))
                return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: amplitude %lld is %s", nm, (long long)(row0 + i), (long long)k,
                                isnan(re) || isnan(im) ? "NaN" : "Inf");
            ss += re * re + im * im;
        }
        {
            qk_result r = qk__state_norm_check(sm, ss, side, row0 + i);
            if (r != QK_OK) return r;
        }
    }
    return QK_OK;
}

/* A provider's rows [row0, row0 + n) of side into buf (n rows of the map's n_features doubles):
   copied from sm->cache where it holds them all, else asked of the provider (one call: n is at
   most sm->chunk), checked (qk__states_check) and shown to rows_fn. On failure the error is set
   and sm->provider_failed holds it. */
QK__PRIV qk_result qk__smap_fetch(qk__smap *sm, int side, int64_t row0, int64_t n, void *buf)
{
    const int64_t rowb = (int64_t)sm->map.n_features * 8;
    qk_result r;
    if (sm->cache && side == sm->cache_side && row0 >= sm->cache_row0 && row0 + n <= sm->cache_row0 + sm->cache_n) {
        memcpy(buf, sm->cache + (size_t)((row0 - sm->cache_row0) * rowb), (size_t)(n * rowb));
        return QK_OK;
    }
    QK_PROF_BEGIN("state provider");
    r = sm->in.provider(side, row0, row0 + n, buf, sm->ld, sm->in.provider_user) ? QK_ERROR_CANCELLED : QK_OK;
    QK_PROF_END("state provider");
    if (r != QK_OK)
        qk__fail(QK_ERROR_CANCELLED, "%s: the state provider failed for %s rows [%lld, %lld) (nothing was written)", sm->fn,
                 side ? "B" : "A", (long long)row0, (long long)(row0 + n));
    else r = qk__states_check(sm, buf, n, rowb, side, row0);
    if (r == QK_OK && sm->rows_fn) r = sm->rows_fn(sm->rows_user, side, row0, n, buf, rowb);
    if (r != QK_OK) sm->provider_failed = r;
    return r;
}

/* The largest |v| of cnt doubles by their bit patterns (sign cleared, an IEEE double's order is
   its bits' order, and Inf / NaN lie above every finite value), in four independent maxima so
   that no comparison waits on the one before. Returns 1 when every value is finite (*xmax set),
   0 when one is not. qk_map_check_data's fast path: a Gram call checks all of X before planning,
   and the row loop's dependent sums held every call up (docs/benchmarks.md, "Per-call costs"). */
static int qk__finite_absmax(const double *x, size_t cnt, double *xmax)
{
    const uint64_t mask = 0x7fffffffffffffffull;
    uint64_t m[4] = {0, 0, 0, 0}, b, top;
    size_t i, k;
    for (i = 0; i + 4 <= cnt; i += 4) {
        for (k = 0; k < 4; k++) {
            memcpy(&b, x + i + k, sizeof b);
            b &= mask;
            m[k] = b > m[k] ? b : m[k];
        }
    }
    for (; i < cnt; i++) {
        memcpy(&b, x + i, sizeof b);
        b &= mask;
        m[0] = b > m[0] ? b : m[0];
    }
    top = m[0];
    for (k = 1; k < 4; k++) top = m[k] > top ? m[k] : top;
    if (top >= 0x7ff0000000000000ull) return 0;   /* Inf or NaN somewhere */
    memcpy(xmax, &top, sizeof top);
    return 1;
}

QKDEF qk_result qk_map_check_data(const qk_map *map, const double *x, int64_t n, const char *name)
{
    int64_t i;
    int j, d, basis = 0, amp = 0, angles = 0, k, fast;
    double xmax = 0.0;
    if (!name) name = "X";
    if (!map || !x) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", name, map ? "data" : "map");
    if (n <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: number of rows must be > 0 (got %lld)", name, (long long)n);
    d = map->n_features;
    if (qk__map_is_mps(map)) return QK_OK;   /* given MPS: checked when their map was made (gram.c) */
    if (qk__map_is_states(map)) {   /* given states: a provider's rows and device rows are checked where they are read */
        const qk__smap *sm = (const qk__smap *)(const void *)map;
        if (map->ops[0].q1 & (QK__STATE_PROVIDER | QK__STATE_DEVICE)) return QK_OK;
        return qk__states_check(sm, x, n, (int64_t)d * 8, strcmp(name, "Y") == 0, 0);
    }
    for (k = 0; k < map->n_ops; k++) {
        if (map->ops[k].kind == QK_OP_BASIS) basis = 1;
        if (map->ops[k].kind == QK_OP_AMPLITUDE) amp = 1;
        if (qk__op_has_angle(map->ops[k].kind)) angles = 1;
    }
    /* ordinary data (every value finite, no basis or amplitude rule): one flat scan; otherwise,
       or to name the first bad value, the rows one by one */
    fast = !basis && !amp && qk__finite_absmax(x, (size_t)n * (size_t)d, &xmax);
    for (i = fast ? n : 0; i < n; i++) {
        const double *row = x + i * d;
        double ss = 0.0;
        char v0[40];
        for (j = 0; j < d; j++) {
            double v = row[j];
            if (!isfinite(v))
                return qk__fail(QK_ERROR_NON_FINITE, "%s[%lld][%d] is %s", name, (long long)i, j, isnan(v) ? "NaN" : "Inf");
            ss += v * v;
            if (fabs(v) > xmax) xmax = fabs(v);
        }
        if (basis) {
            for (k = 0; k < map->n_ops; k++) {
                if (map->ops[k].kind != QK_OP_BASIS) continue;
                j = map->ops[k].angle.x0;
                if (row[j] != 0.0 && row[j] != 1.0)
                    return qk__fail(QK_ERROR_BAD_DATA, "%s[%lld][%d] = %s: basis encoding needs 0 or 1", name, (long long)i, j,
                                    qk__fmt_g(v0, sizeof v0, row[j], 6));
            }
        }
        if (amp) {
            /* The engines normalise with 1/sqrt(sum of squares): it must be a normal, finite
               double, or the amplitudes come out Inf, NaN or imprecise. */
            if (!isfinite(ss)) {
                for (j = 1, k = 0; j < d; j++) if (fabs(row[j]) > fabs(row[k])) k = j;
                return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding: the sum of squares overflows (%s[%lld][%d] = %s); "
                                "scale the row (the state is the same)", name, (long long)i, name, (long long)i, k,
                                qk__fmt_g(v0, sizeof v0, row[k], 6));
            }
            if (ss == 0.0) {
                for (j = 0; j < d && row[j] == 0.0; j++) {}
                if (j == d)
                    return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding needs a finite non-zero norm (sum of squares 0)",
                                    name, (long long)i);
            }
            if (ss < DBL_MIN)
                return qk__fail(QK_ERROR_ZERO_NORM, "%s row %lld: amplitude encoding: the sum of squares underflows (%s, below "
                                "DBL_MIN: the normalised amplitudes would be wrong); scale the row (the state is the same)",
                                name, (long long)i, qk__fmt_g(v0, sizeof v0, ss, 6));
        }
    }
    /* Finite features can still make an angle overflow ((pi - 1e300)^2 is Inf): the state
       would be NaN and so would K. A bound from the largest |x| clears ordinary data with
       O(ops) work; only when it does not are the angles evaluated row by row. */
    if (angles && !qk__angles_bounded(map, xmax)) {
        for (i = 0; i < n; i++) {
            const double *row = x + i * d;
            char v0[40];
            for (k = 0; k < map->n_ops; k++) {
                const qk_op *o = &map->ops[k];
                double t;
                if (!qk__op_has_angle(o->kind)) continue;
                t = qk__angle_value(&o->angle, row, map->weights);
                if (!(fabs(t) <= QK_MAX_ABS_ANGLE)) {
                    char in[200], ex[160], q1[16] = "";
                    qk__angle_inputs(&o->angle, row, map->weights, name, i, in, sizeof in);
                    qk__fmt_angle(&o->angle, ex, sizeof ex);
                    if (qk__op_arity(o->kind) == 2) snprintf(q1, sizeof q1, ",%d", o->q1);
                    return qk__fail(QK_ERROR_BAD_DATA, "%s row %lld: op %d, %s(%d%s, %s), has angle %s with %s: angles must be "
                                    "finite and at most %g rad; scale the features", name, (long long)i, k,
                                    qk__op_name(o->kind), o->q0, q1, ex, qk__fmt_g(v0, sizeof v0, t, 6), in, QK_MAX_ABS_ANGLE);
                }
            }
        }
    }
    return QK_OK;
}


/* >>parser ---- the map spec parser ---- */
/* Grammar (docs/maps.md):
     spec   := name [ '(' [param {',' param}] [':' ops] ')' ]
     param  := key '=' value
     ops    := { gate '(' int [',' int] [',' angle] ')' [';'] }
     angle  := number | [number '*'] factor [('+'|'-') number]
     factor := xI | wI | xI '*' xJ | wK '*' xI | '(' 'pi' '-' xI ')' '*' '(' 'pi' '-' xJ ')'
     number := [-] (decimal | 'pi')
   Errors name the column (1-based) of the offending token. */
typedef struct qk__parser {
    const char *s;
    const char *p;
    qk__radix rx;       /* the locale's decimal point (numbers are read in C syntax) */
    int oom;            /* a long number could not be copied: the error is out of memory */
} qk__parser;

static void qk__ws(qk__parser *ps) { while (*ps->p && isspace((unsigned char)*ps->p)) ps->p++; }
static int qk__col(const qk__parser *ps) { return (int)(ps->p - ps->s) + 1; }

/* The spec as a message quotes it: escaped, at most 120 bytes, then "... (N bytes)". */
static const char *qk__spec_esc(const qk__parser *ps, char *buf, size_t size)
{
    size_t n = strlen(ps->s), k;
    qk__esc(buf, size > 24 ? size - 24 : size, ps->s, n, 120);
    k = strlen(buf);
    if (n > 120 && size > 24) snprintf(buf + k, size - k, " (%lu bytes)", (unsigned long)n);
    return buf;
}

static qk_result qk__perr(qk__parser *ps, const char *fmt, const char *arg)
{
    char msg[256], es[200];
    if (ps->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map spec: out of memory reading a number");
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");   /* arg: an identifier or a message of ours */
    return qk__fail(QK_ERROR_PARSE, "map spec \"%s\", column %d: %s", qk__spec_esc(ps, es, sizeof es), qk__col(ps), msg);
}

static int qk__accept(qk__parser *ps, char c)
{
    qk__ws(ps);
    if (*ps->p == c) { ps->p++; return 1; }
    return 0;
}

/* identifier [a-z_][a-z0-9_]* (lower-cased into buf) */
static int qk__ident(qk__parser *ps, char *buf, size_t size)
{
    size_t n = 0;
    qk__ws(ps);
    if (!isalpha((unsigned char)*ps->p) && *ps->p != '_') return 0;
    while (isalnum((unsigned char)*ps->p) || *ps->p == '_') {
        if (n + 1 < size) buf[n++] = (char)tolower((unsigned char)*ps->p);
        ps->p++;
    }
    buf[n] = 0;
    return 1;
}

static int qk__number(qk__parser *ps, double *v)
{
    const char *start;
    size_t n;
    int neg = 0;
    qk__ws(ps);
    start = ps->p;
    if (*ps->p == '-' || *ps->p == '+') { neg = *ps->p == '-'; ps->p++; qk__ws(ps); }
    if ((ps->p[0] == 'p' || ps->p[0] == 'P') && (ps->p[1] == 'i' || ps->p[1] == 'I') && !isalnum((unsigned char)ps->p[2])) {
        ps->p += 2;
        *v = neg ? -QK__PI : QK__PI;
        return 1;
    }
    if (*ps->p == '+' || *ps->p == '-') { ps->p = start; return 0; }   /* one sign only */
    n = qk__num_len(ps->p, (size_t)-1, 0);   /* no bound needed: the scan stops at the NUL */
    if (!n) { ps->p = start; return 0; }
    if (!qk__strtod_c(ps->p, n, &ps->rx, v)) { ps->oom = 1; ps->p = start; return 0; }
    if (isinf(*v)) { ps->p = start; return 0; }   /* out of range */
    ps->p += n;
    if (neg) *v = -*v;
    return 1;
}

/* A non-negative decimal integer: 1 read (into *v), 0 none (nothing consumed), -1 larger than
   INT_MAX (nothing consumed). Locale-free by construction. */
static int qk__int(qk__parser *ps, int *v)
{
    const char *p;
    int64_t x = 0;
    qk__ws(ps);
    p = ps->p;
    if (!isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) {
        x = x * 10 + (*p++ - '0');
        if (x > 0x7fffffff) return -1;
    }
    ps->p = p;
    *v = (int)x;
    return 1;
}

/* 'x' or 'w' followed by an index */
static int qk__var(qk__parser *ps, char which, int *idx)
{
    const char *start;
    qk__ws(ps);
    start = ps->p;
    if (tolower((unsigned char)*ps->p) != which) return 0;
    ps->p++;
    if (!isdigit((unsigned char)*ps->p)) { ps->p = start; return 0; }
    if (qk__int(ps, idx) != 1) { ps->p = start; return 0; }
    return 1;
}

/* '(' 'pi' '-' xI ')' */
static int qk__pi_minus(qk__parser *ps, int *idx)
{
    const char *start = ps->p;
    char id[8];
    if (!qk__accept(ps, '(')) return 0;
    if (!qk__ident(ps, id, sizeof id) || strcmp(id, "pi") != 0) { ps->p = start; return 0; }
    if (!qk__accept(ps, '-') || !qk__var(ps, 'x', idx) || !qk__accept(ps, ')')) { ps->p = start; return 0; }
    return 1;
}

static qk_result qk__angle_expr(qk__parser *ps, qk_angle *a)
{
    double num = 0.0;
    int have_num, i0, i1;
    const char *save;
    *a = qk__ang(QK_ARG_CONST, 0, 0, 0, 1.0, 0.0);
    qk__ws(ps);
    save = ps->p;
    /* leading "-x0" means scale -1 */
    if (*ps->p == '-' && (tolower((unsigned char)ps->p[1]) == 'x' || tolower((unsigned char)ps->p[1]) == 'w' || ps->p[1] == '(')) {
        ps->p++;
        a->scale = -1.0;
        have_num = 0;
    } else {
        have_num = qk__number(ps, &num);
    }
    if (have_num) {
        if (!qk__accept(ps, '*')) {           /* a plain number */
            a->offset = num;
            return QK_OK;
        }
        a->scale = num;
    }
    save = ps->p;
    qk__ws(ps);
    if (qk__var(ps, 'x', &i0)) {
        if (qk__accept(ps, '*')) {
            if (!qk__var(ps, 'x', &i1)) return qk__perr(ps, "expected a feature xJ after '*'", NULL);
            a->kind = QK_ARG_XX; a->x0 = i0; a->x1 = i1;
        } else {
            a->kind = QK_ARG_X; a->x0 = i0;
        }
    } else if (qk__var(ps, 'w', &i0)) {
        if (qk__accept(ps, '*')) {
            if (!qk__var(ps, 'x', &i1)) return qk__perr(ps, "expected a feature xI after 'wK*'", NULL);
            a->kind = QK_ARG_WX; a->w = i0; a->x0 = i1;
        } else {
            a->kind = QK_ARG_W; a->w = i0;
        }
    } else if (qk__pi_minus(ps, &i0)) {
        if (!qk__accept(ps, '*') || !qk__pi_minus(ps, &i1)) return qk__perr(ps, "expected '*(pi-xJ)' after '(pi-xI)'", NULL);
        a->kind = QK_ARG_PIXX; a->x0 = i0; a->x1 = i1;
    } else {
        ps->p = save;
        qk__ws(ps);
        return qk__perr(ps, "expected an angle: a number, xI, wI, xI*xJ, wK*xI or (pi-xI)*(pi-xJ)", NULL);
    }
    qk__ws(ps);
    if (*ps->p == '+' || *ps->p == '-') {
        int neg = *ps->p == '-';
        ps->p++;
        if (!qk__number(ps, &num)) return qk__perr(ps, "expected a number after '+' or '-'", NULL);
        a->offset = neg ? -num : num;
    }
    return QK_OK;
}

typedef struct qk__gate_name { const char *name; qk_op_kind kind; } qk__gate_name;
static const qk__gate_name qk__gates[] = {
    {"h", QK_OP_H}, {"x", QK_OP_X}, {"y", QK_OP_Y}, {"z", QK_OP_Z},
    {"rx", QK_OP_RX}, {"ry", QK_OP_RY}, {"rz", QK_OP_RZ}, {"p", QK_OP_P},
    {"cx", QK_OP_CNOT}, {"cnot", QK_OP_CNOT}, {"cz", QK_OP_CZ}, {"rzz", QK_OP_RZZ},
};

static qk_result qk__parse_ops(qk__parser *ps, qk__ops *l)
{
    for (;;) {
        char name[16];
        const char *at;
        size_t g;
        qk_op_kind kind = (qk_op_kind)0;
        int q0 = 0, q1 = 0, ar;
        qk_angle a = qk__noang();
        qk_result r;
        while (qk__accept(ps, ';')) {}
        qk__ws(ps);
        if (*ps->p == ')' || *ps->p == 0) return QK_OK;
        at = ps->p;
        if (!qk__ident(ps, name, sizeof name)) return qk__perr(ps, "expected a gate name", NULL);
        for (g = 0; g < sizeof qk__gates / sizeof qk__gates[0]; g++)
            if (strcmp(name, qk__gates[g].name) == 0) kind = qk__gates[g].kind;
        if (!kind) { ps->p = at; return qk__perr(ps, "unknown gate '%s' (h x y z rx ry rz p cx cnot cz rzz)", name); }
        ar = qk__op_arity(kind);
        if (!qk__accept(ps, '(')) return qk__perr(ps, "expected '(' after gate '%s'", name);
        if (qk__int(ps, &q0) != 1) return qk__perr(ps, "expected a qubit index", NULL);
        if (ar == 2) {
            if (!qk__accept(ps, ',') || qk__int(ps, &q1) != 1) return qk__perr(ps, "expected ', qubit' (gate '%s' takes two qubits)", name);
        }
        if (qk__op_has_angle(kind)) {
            if (!qk__accept(ps, ',')) return qk__perr(ps, "expected ', angle' (gate '%s' takes an angle)", name);
            r = qk__angle_expr(ps, &a);
            if (r != QK_OK) return r;
        }
        if (!qk__accept(ps, ')')) return qk__perr(ps, "expected ')' to close gate '%s'", name);
        if (l->n >= QK_MAX_OPS) {
            char lim[16];
            snprintf(lim, sizeof lim, "%d", (int)QK_MAX_OPS);
            ps->p = at;
            return qk__perr(ps, "more than QK_MAX_OPS (%s) gates", lim);
        }
        qk__push(l, kind, q0, q1, a);
        if (l->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "map spec: out of memory");
    }
}

/* After a parameter's number: letters, digits, '.', '_' right after it (0x10, 2.0, 1e3, 5abc)
   are stray characters of a value that is no number of the kind asked for. Reports them (at
   their column, the whole value quoted) and returns 1; 0 when the value ends cleanly. */
static int qk__stray(qk__parser *ps, const char *key, const char *vat)
{
    const char *q = ps->p, *e = ps->p;
    char m[256], v[80], st[80];
    if (!isalnum((unsigned char)*q) && *q != '.' && *q != '_') return 0;
    while (isalnum((unsigned char)*e) || *e == '.' || *e == '_' || *e == '+' || *e == '-') e++;
    snprintf(m, sizeof m, "stray characters '%s' after the number in '%s=%s'", qk__esc(st, sizeof st, q, (size_t)(e - q), 24),
             key, qk__esc(v, sizeof v, vat, (size_t)(e - vat), 24));
    (void)qk__perr(ps, "%s", m);
    return 1;
}

/* The parameters a map's spec takes (for the message about an unknown one). */
static const char *qk__map_params(qk_map_type t)
{
    switch (t) {
    case QK_MAP_ZZ: return "reps, alpha, ent, qubits";
    case QK_MAP_IQP: return "reps (or n_repeats), qubits";
    case QK_MAP_ANGLE: return "rot, qubits";
    case QK_MAP_AMPLITUDE: return "qubits";
    case QK_MAP_BASIS: return "qubits";
    case QK_MAP_HEA: return "layers (or reps), rot, ent, qubits";
    case QK_MAP_CUSTOM: return "qubits, features, weights, then ':' and the gates";
    default: return "?";
    }
}

QKDEF qk_result qk_map_parse(const char *spec, int n_features, qk_map **out)
{
    qk__parser ps;
    qk_map_desc d;
    qk__ops l;
    char name[32], key[32], val[32];
    char given[8][32];   /* the key that set each parameter (reps, layers and n_repeats are one), "" none yet */
    qk_result r;
    int has_ops = 0;
    memset(given, 0, sizeof given);
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_parse: out is NULL");
    *out = NULL;
    if (!spec) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_map_parse: spec is NULL");
    memset(&d, 0, sizeof d);
    memset(&l, 0, sizeof l);
    ps.s = ps.p = spec;
    ps.oom = 0;
    qk__radix_init(&ps.rx);
    d.n_features = n_features;
    if (!qk__ident(&ps, name, sizeof name)) return qk__perr(&ps, "expected a map name (zz, iqp, angle, amplitude, basis, hea, circuit)", NULL);
    if (!strcmp(name, "zz")) d.type = QK_MAP_ZZ;
    else if (!strcmp(name, "iqp")) d.type = QK_MAP_IQP;
    else if (!strcmp(name, "angle")) d.type = QK_MAP_ANGLE;
    else if (!strcmp(name, "amplitude") || !strcmp(name, "amp")) d.type = QK_MAP_AMPLITUDE;
    else if (!strcmp(name, "basis")) d.type = QK_MAP_BASIS;
    else if (!strcmp(name, "hea")) d.type = QK_MAP_HEA;
    else if (!strcmp(name, "circuit")) d.type = QK_MAP_CUSTOM;
    else { ps.p = spec; qk__ws(&ps); return qk__perr(&ps, "unknown map '%s' (zz, iqp, angle, amplitude, basis, hea, circuit)", name); }
    if (qk__accept(&ps, '(')) {
        if (!qk__accept(&ps, ')')) {
            for (;;) {
                const char *kat, *vat;
                double num;
                int iv;
                qk__ws(&ps);
                if (d.type == QK_MAP_CUSTOM && *ps.p == ':') { ps.p++; has_ops = 1; break; }
                kat = ps.p;
                if (!qk__ident(&ps, key, sizeof key)) return qk__perr(&ps, "expected a parameter name", NULL);
                if (!qk__accept(&ps, '=')) return qk__perr(&ps, "expected '=' after '%s'", key);
                qk__ws(&ps);
                vat = ps.p;
#define QK__BADKEY() do { char m_[160]; ps.p = kat; \
                snprintf(m_, sizeof m_, "unknown parameter '%s' for %s (its parameters: %s)", key, name, qk__map_params(d.type)); \
                return qk__perr(&ps, "%s", m_); } while (0)
#define QK__INTVAL(dst, max) do { char m_[128]; int g_ = qk__int(&ps, &iv); ps.p = g_ == 1 ? ps.p : vat; \
                if (g_ == 1 && qk__stray(&ps, key, vat)) return QK_ERROR_PARSE; \
                if (g_ == 0) return qk__perr(&ps, "'%s' needs a non-negative integer", key); \
                if (g_ < 0 || iv > (max)) { snprintf(m_, sizeof m_, "'%s' is larger than its maximum, %s (%d)", key, #max, (int)(max)); \
                    ps.p = vat; return qk__perr(&ps, "%s", m_); } \
                dst = iv; } while (0)
                if (!strcmp(key, "qubits")) {
                    QK__INTVAL(d.n_qubits, QK_MAX_PRODUCT_QUBITS);
                    if (d.n_qubits <= 0) { ps.p = vat; return qk__perr(&ps, "qubits must be > 0", NULL); }
                } else if (!strcmp(key, "reps") || !strcmp(key, "layers") || !strcmp(key, "n_repeats")) {
                    if (d.type != QK_MAP_ZZ && d.type != QK_MAP_IQP && d.type != QK_MAP_HEA) QK__BADKEY();
                    QK__INTVAL(d.reps, QK_MAX_REPS);
                    if (d.reps <= 0) { ps.p = vat; return qk__perr(&ps, "'%s' must be > 0", key); }
                } else if (!strcmp(key, "alpha")) {
                    if (d.type != QK_MAP_ZZ) QK__BADKEY();
                    iv = qk__number(&ps, &num);
                    if (iv && qk__stray(&ps, key, vat)) return QK_ERROR_PARSE;
                    if (!iv || num == 0.0) { ps.p = vat; return qk__perr(&ps, "alpha needs a non-zero number", NULL); }
                    d.alpha = num;
                } else if (!strcmp(key, "features")) {
                    if (d.type != QK_MAP_CUSTOM) QK__BADKEY();
                    QK__INTVAL(iv, 0x7fffffff);
                    if (iv != n_features) { char es_[200]; ps.p = vat; return qk__fail(QK_ERROR_SHAPE, "map spec \"%s\", column %d: circuit declares %d features, the data has %d", qk__spec_esc(&ps, es_, sizeof es_), qk__col(&ps), iv, n_features); }
                } else if (!strcmp(key, "weights")) {
                    if (d.type != QK_MAP_CUSTOM) QK__BADKEY();
                    QK__INTVAL(d.n_weights, QK_MAX_WEIGHTS);
                } else if (!strcmp(key, "ent")) {
                    if (!qk__ident(&ps, val, sizeof val)) { ps.p = vat; return qk__perr(&ps, "ent needs a name", NULL); }
                    if (d.type == QK_MAP_ZZ) {
                        if (!strcmp(val, "full")) d.ent = QK_ENT_FULL;
                        else if (!strcmp(val, "linear")) d.ent = QK_ENT_LINEAR;
                        else if (!strcmp(val, "reverse_linear")) d.ent = QK_ENT_REVERSE_LINEAR;
                        else if (!strcmp(val, "circular")) d.ent = QK_ENT_CIRCULAR;
                        else if (!strcmp(val, "pairwise")) d.ent = QK_ENT_PAIRWISE;
                        else if (!strcmp(val, "sca")) d.ent = QK_ENT_SCA;
                        else { ps.p = vat; return qk__perr(&ps, "unknown entanglement '%s' (full, linear, reverse_linear, circular, pairwise, sca)", val); }
                    } else if (d.type == QK_MAP_HEA) {
                        if (!strcmp(val, "cz")) d.cnot = 0;
                        else if (!strcmp(val, "cnot") || !strcmp(val, "cx")) d.cnot = 1;
                        else { ps.p = vat; return qk__perr(&ps, "unknown hea ring '%s' (cz, cnot)", val); }
                    } else QK__BADKEY();
                } else if (!strcmp(key, "rot")) {
                    if (!qk__ident(&ps, val, sizeof val)) { ps.p = vat; return qk__perr(&ps, "rot needs a name", NULL); }
                    if (d.type == QK_MAP_ANGLE && (!strcmp(val, "x") || !strcmp(val, "y") || !strcmp(val, "z"))) d.rot = val[0];
                    else if (d.type == QK_MAP_HEA && !strcmp(val, "y")) d.rot = 'y';
                    else if (d.type == QK_MAP_HEA && !strcmp(val, "yz")) d.rot = 'z';
                    else if (d.type == QK_MAP_ANGLE || d.type == QK_MAP_HEA) { ps.p = vat; return qk__perr(&ps, d.type == QK_MAP_ANGLE ? "rot must be x, y or z (got '%s')" : "rot must be y or yz (got '%s')", val); }
                    else QK__BADKEY();
                } else {
                    QK__BADKEY();
                }
#undef QK__BADKEY
#undef QK__INTVAL
                {   /* each parameter once: zz(reps=2,reps=3) is an error, as a repeated CLI option is */
                    static const char *const slots[] = {"qubits", "reps", "alpha", "features", "weights", "ent", "rot"};
                    const char *k_ = !strcmp(key, "layers") || !strcmp(key, "n_repeats") ? "reps" : key;
                    int sl_;
                    for (sl_ = 0; sl_ < (int)(sizeof slots / sizeof slots[0]) && strcmp(slots[sl_], k_); sl_++) {}
                    if (given[sl_][0]) {
                        char m_[160];
                        ps.p = kat;
                        if (!strcmp(given[sl_], key))
                            snprintf(m_, sizeof m_, "'%.64s' is given twice (each parameter may be given once)", key);
                        else
                            snprintf(m_, sizeof m_, "'%.48s' repeats '%.48s' (the same parameter; each may be given once)", key,
                                     given[sl_]);
                        return qk__perr(&ps, "%s", m_);
                    }
                    snprintf(given[sl_], sizeof given[sl_], "%s", key);
                }
                if (qk__accept(&ps, ',')) continue;
                qk__ws(&ps);
                if (d.type == QK_MAP_CUSTOM && *ps.p == ':') { ps.p++; has_ops = 1; break; }
                if (*ps.p == ')') break;
                return qk__perr(&ps, "expected ',' or ')'", NULL);
            }
            if (has_ops) {
                r = qk__parse_ops(&ps, &l);
                if (r != QK_OK) { QK_FREE(l.ops); return r; }
            }
            if (!qk__accept(&ps, ')')) { QK_FREE(l.ops); return qk__perr(&ps, "expected ')'", NULL); }
        }
    }
    qk__ws(&ps);
    if (*ps.p) { QK_FREE(l.ops); return qk__perr(&ps, "unexpected text after the map", NULL); }
    if (d.type == QK_MAP_CUSTOM) {
        if (!d.n_qubits) { char es_[200]; QK_FREE(l.ops); return qk__fail(QK_ERROR_PARSE, "map spec \"%s\": circuit needs qubits=N", qk__spec_esc(&ps, es_, sizeof es_)); }
        d.ops = l.ops;
        d.n_ops = l.n;
    }
    r = qk_map_make(&d, out);
    QK_FREE(l.ops);
    return r;
}

/* snprintf-like appender that keeps counting past the end of the buffer */
QK__PRIV void qk__cat(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(*len < size ? buf + *len : NULL, *len < size ? size - *len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n;
}

QKDEF int qk_map_spec(const qk_map *m, char *buf, size_t size)
{
    static const char *ents[] = {"full", "full", "linear", "reverse_linear", "circular", "pairwise", "sca"};
    size_t len = 0;
    const qk_map_desc *d;
    int i;
    if (size && buf) buf[0] = 0;
    if (!m) return 0;
    if (!buf) size = 0;
    d = &m->desc;
    switch (m->type) {
    case QK_MAP_ZZ: {
        char al[40];
        qk__cat(buf, size, &len, "zz(reps=%d,alpha=%s,ent=%s)", d->reps, qk__fmt_g(al, sizeof al, d->alpha, 17), ents[d->ent]);
        break;
    }
    case QK_MAP_IQP: qk__cat(buf, size, &len, "iqp(reps=%d)", d->reps); break;
    case QK_MAP_ANGLE: qk__cat(buf, size, &len, "angle(rot=%c)", d->rot); break;
    case QK_MAP_AMPLITUDE: qk__cat(buf, size, &len, "amplitude(qubits=%d)", m->n_qubits); break;
    case QK_MAP_BASIS: qk__cat(buf, size, &len, "basis"); break;
    case QK_MAP_HEA: qk__cat(buf, size, &len, "hea(qubits=%d,layers=%d,rot=%s,ent=%s)", m->n_qubits, d->reps, d->rot == 'z' ? "yz" : "y", d->cnot ? "cnot" : "cz"); break;
    default:
        qk__cat(buf, size, &len, "circuit(qubits=%d,weights=%d:", m->n_qubits, m->n_weights);
        for (i = 0; i < m->n_ops; i++) {
            const qk_op *o = &m->ops[i];
            size_t g;
            const char *nm = "?";
            char ang[160];
            for (g = 0; g < sizeof qk__gates / sizeof qk__gates[0]; g++)
                if (qk__gates[g].kind == o->kind) { nm = qk__gates[g].name; break; }
            if (o->kind == QK_OP_AMPLITUDE || o->kind == QK_OP_BASIS) nm = "?"; /* not expressible */
            qk__cat(buf, size, &len, " %s(%d", nm, o->q0);
            if (qk__op_arity(o->kind) == 2) qk__cat(buf, size, &len, ",%d", o->q1);
            if (qk__op_has_angle(o->kind)) { qk__fmt_angle(&o->angle, ang, sizeof ang); qk__cat(buf, size, &len, ",%s", ang); }
            qk__cat(buf, size, &len, ")");
        }
        qk__cat(buf, size, &len, ")");
        break;
    }
    return (int)len;
}


/* >>cpu_pool ---- CPU engine: thread pool, the Gram job and its progress / cancel polls ---- */
/* ---- thread pool: a parallel-for over work items taken from an atomic counter ---- */
typedef struct qk__pool_arg { qk__work_fn fn; void *ctx; int thread; } qk__pool_arg;

static void *qk__pool_main(void *p)
{
    qk__pool_arg *a = (qk__pool_arg *)p;
    a->fn(a->ctx, a->thread);
    return NULL;
}

QK__PRIV int qk__ncores(void)
{
#ifndef QK_NO_THREADS
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
#else
    return 1;
#endif
}

/* ---- the CPU kernels' instruction set (runtime dispatch; qk_internal.h, cpu_gram.c) ---- */
/* -1 until chosen, then the level (QK__ISA_*) | the note << 4: why QK_CPU_ISA was not taken */
static int qk__isa_state = -1;
enum { QK__ISA_NOTE_NONE, QK__ISA_NOTE_UNKNOWN, QK__ISA_NOTE_LACKS, QK__ISA_NOTE_FIXED };
static const char *const qk__isa_names[3] = {"generic", "avx2", "avx512"};

#if !defined(QK__DISPATCH)
/* The name of a build's own kernels (no dispatch): its compile target's (-march) */
static const char *qk__isa_build_name(void)
{
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#else
    return "generic";
#endif
}
#endif

/* The levels this build and CPU can run: bit l for QK__ISA_* l (generic always). The CPU's own
   word (__builtin_cpu_supports, which also checks that the OS saves the wider registers). */
static int qk__isa_avail(void)
{
#if defined(QK__DISPATCH)
    int m = 1;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) m |= 2;
    if ((m & 2) && __builtin_cpu_supports("avx512f")) m |= 4;
    return m;
#else
    return 1;
#endif
}

static int qk__isa_best(int avail) { return avail & 4 ? QK__ISA_AVX512 : avail & 2 ? QK__ISA_AVX2 : QK__ISA_GENERIC; }

/* generic / avx2 / avx512 -> QK__ISA_*; "auto" (or NULL, "") -> -2; else -1 */
static int qk__isa_parse(const char *s)
{
    int l;
    if (!s || !*s || !strcmp(s, "auto")) return -2;
    for (l = 0; l < 3; l++) if (!strcmp(s, qk__isa_names[l])) return l;
    return -1;
}

/* The level for a request s (QK_CPU_ISA's value, may be NULL), and why it was not taken */
static int qk__isa_pick(const char *s, int *note)
{
    const int avail = qk__isa_avail(), l = qk__isa_parse(s);
    *note = QK__ISA_NOTE_NONE;
    if (l == -2) return qk__isa_best(avail);
    if (l == -1) { *note = QK__ISA_NOTE_UNKNOWN; return qk__isa_best(avail); }
#if defined(QK__DISPATCH)
    if (!(avail >> l & 1)) { *note = QK__ISA_NOTE_LACKS; return qk__isa_best(avail); }
    return l;
#else
    if (strcmp(s, qk__isa_build_name())) *note = QK__ISA_NOTE_FIXED;
    return QK__ISA_GENERIC;
#endif
}

QK__PRIV int qk__cpu_isa(void)
{
    int st = QK__LOAD(&qk__isa_state);
    if (st < 0) {   /* the first call: QK_CPU_ISA, else the best (racing first calls agree) */
        int note = 0, want = -1;
        const int l = qk__isa_pick(getenv("QK_CPU_ISA"), &note);   /* before note is read: `|`'s operands are unsequenced */
        st = l | note << 4;
#ifndef QK_NO_THREADS
        if (!__atomic_compare_exchange_n(&qk__isa_state, &want, st, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) st = want;
#else
        (void)want;
        qk__isa_state = st;
#endif
    }
    return st & 15;
}

QKDEF const char *qk_cpu_isa(void)
{
    const int l = qk__cpu_isa();
#if defined(QK__DISPATCH)
    return qk__isa_names[l];
#else
    (void)l;
    return qk__isa_build_name();
#endif
}

QKDEF qk_result qk_cpu_isa_set(const char *isa)
{
    const int avail = qk__isa_avail();
    int l = qk__isa_parse(isa);
    char e[QK__ESC_ARG_SIZE];
    if (l == -1)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_cpu_isa_set: unknown instruction set %s (generic, avx2, avx512 or auto)",
                        qk__esc_arg(e, sizeof e, isa));
    if (l == -2) l = qk__isa_best(avail);
#if defined(QK__DISPATCH)
    else if (!(avail >> l & 1))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_cpu_isa_set: this CPU lacks %s (%s); the kernels stay %s (the best it has: %s)",
                        qk__isa_names[l], l == QK__ISA_AVX512 ? "avx512f" : "avx2 and fma", qk_cpu_isa(), qk__isa_names[qk__isa_best(avail)]);
#else
    else if (strcmp(isa, qk__isa_build_name()))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_cpu_isa_set: this build has no runtime dispatch: its kernels are %s, its compile "
                        "target's (-march=native or another target with AVX2, not x86-64, QK_NO_DISPATCH or QK_NO_VECTOR_EXT); "
                        "a portable x86-64 build (no -march, Meson -Dnative=false) chooses at run time", qk__isa_build_name());
    else l = QK__ISA_GENERIC;
#endif
    QK__STORE(&qk__isa_state, l);
    return QK_OK;
}

QKDEF const char *qk_cpu_isa_note(void)
{
    static QK__TLS char buf[QK__ESC_ARG_SIZE + 192];
    const int note = (qk__cpu_isa(), QK__LOAD(&qk__isa_state)) >> 4;
    char e[QK__ESC_ARG_SIZE];
    const char *v = getenv("QK_CPU_ISA");
    buf[0] = 0;
    if (note == QK__ISA_NOTE_NONE || !v) return buf;
    qk__esc_arg(e, sizeof e, v);
    if (note == QK__ISA_NOTE_UNKNOWN)
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s is not generic, avx2, avx512 or auto: the kernels use %s, the best this CPU has", e, qk_cpu_isa());
    else if (note == QK__ISA_NOTE_LACKS)
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s: this CPU lacks %s: the kernels use %s, the best it has", e,
                 !strcmp(v, "avx512") ? "avx512f" : "avx2 and fma", qk_cpu_isa());
    else
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s ignored: this build has no runtime dispatch; its kernels are %s, its compile target's", e,
                 qk_cpu_isa());
    return buf;
}

/* A context's pool of worker threads, started once (on its first qk_gram) and reused by every
   parallel step of its calls: the CPU engine's states and tiles, the GPU engine's host copy-out
   (a 1.6 GB K is 24 slabs; starting 15 threads per slab cost more than a tenth of the copy).
   qk_gram makes it the calling thread's current pool for the call; qk__parallel uses the current
   pool when there is one, else starts threads for the step. Without threads (QK_NO_THREADS) a
   pool has no workers: its caller runs every step alone. */
/* qk__tpool: in qk_internal.h */

static void *qk__tpool_main(void *p)
{
    qk__tpool_worker *w = (qk__tpool_worker *)p;
    qk__tpool *t = w->pool;
    unsigned seen = 0;
    qk__mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->gen == seen) qk__cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->gen;
        if (w->index < t->want) {
            qk__work_fn fn = t->fn;
            void *arg = t->arg;
            qk__mutex_unlock(&t->mu);
            fn(arg, w->index);
            qk__mutex_lock(&t->mu);
            if (QK__FETCH_ADD(&t->busy, -1) == 1) qk__cond_signal(&t->done);
        }
    }
    qk__mutex_unlock(&t->mu);
    return NULL;
}

/* Starts up to n - 1 workers (the caller is thread 0); fewer when threads cannot be started. */
QK__PRIV qk_result qk__tpool_start(qk__tpool *t, int n)
{
    int i;
    memset(t, 0, sizeof *t);
    if (qk__mutex_init(&t->mu) != 0) return QK_ERROR_OUT_OF_MEMORY;
    if (qk__cond_init(&t->go) != 0) { qk__mutex_destroy(&t->mu); return QK_ERROR_OUT_OF_MEMORY; }
    if (qk__cond_init(&t->done) != 0) {
        qk__cond_destroy(&t->go);
        qk__mutex_destroy(&t->mu);
        return QK_ERROR_OUT_OF_MEMORY;
    }
    if (n > 256) n = 256;
    t->pid = qk__pid();
    for (i = 1; i < n; i++) {
        t->w[i - 1].pool = t;
        t->w[i - 1].index = i;
        if (!qk__thread_start(&t->th[i - 1], qk__tpool_main, &t->w[i - 1])) break;
        t->n_workers = i;
    }
    return QK_OK;
}

/* 1: t was started by another process, of which this one is a fork. Its workers stayed there
   (a fork copies only the calling thread), so a step would wait for them forever, and its mutex
   may have been held by one of them at the fork: such a pool is neither run nor stopped, only
   forgotten (qk__ctx_pool_of, qk_ctx_destroy). */
QK__PRIV int qk__tpool_forked(const qk__tpool *t)
{
    return t->pid != qk__pid();
}

QK__PRIV void qk__tpool_stop(qk__tpool *t)
{
    int i;
    qk__mutex_lock(&t->mu);
    t->quit = 1;
    qk__cond_broadcast(&t->go);
    qk__mutex_unlock(&t->mu);
    for (i = 0; i < t->n_workers; i++) qk__thread_join(t->th[i]);
    qk__cond_destroy(&t->done);
    qk__cond_destroy(&t->go);
    qk__mutex_destroy(&t->mu);
}

/* fn(arg, t) for t = 0..min(n_threads, workers + 1) - 1, thread 0 the caller; returns when all have */
QK__PRIV void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg)
{
    int s;
    qk__mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->want = n_threads < t->n_workers + 1 ? n_threads : t->n_workers + 1;
    QK__STORE(&t->busy, t->want - 1);
    t->gen++;
    qk__cond_broadcast(&t->go);
    qk__mutex_unlock(&t->mu);
    fn(arg, 0);
    /* a caller that sleeps on the condition wakes up to a few tenths of a millisecond after the
       last worker signals; a pool whose steps are that short (several GPUs' shares) yields first */
    for (s = t->spin; s > 0 && QK__LOAD(&t->busy) > 0; s--) qk__yield();
    qk__mutex_lock(&t->mu);
    while (QK__LOAD(&t->busy) > 0) qk__cond_wait(&t->done, &t->mu);
    qk__mutex_unlock(&t->mu);
}

QK__PRIV QK__TLS qk__tpool *qk__cur_pool;

/* Runs fn(ctx, t) for t = 0..n_threads-1; thread 0 is the caller: on the current context's pool
   when there is one, else on threads started for the step. If a thread cannot be started, the
   threads that did start (and the caller) still drain the shared work. */
QK__PRIV void qk__parallel(int n_threads, qk__work_fn fn, void *ctx)
{
    qk__thread th[256];
    qk__pool_arg args[256];
    int i, started = 0;
    if (qk__cur_pool && n_threads > 1) { qk__tpool_run(qk__cur_pool, n_threads, fn, ctx); return; }
    if (n_threads > 256) n_threads = 256;
    for (i = 1; i < n_threads; i++) {
        args[i].fn = fn; args[i].ctx = ctx; args[i].thread = i;
        if (!qk__thread_start(&th[i], qk__pool_main, &args[i])) break;
        started = i;
    }
    fn(ctx, 0);
    for (i = 1; i <= started; i++) qk__thread_join(th[i]);
}


/* qk__poll, qk__gram_job (the job of the CPU engine and the MPS engine): in qk_internal.h */

/* The progress callback (cancel when it says so), from one thread at a time: compute thread 0
   after each tile, the state builders every few ms of work (qk__poll), and the streamed output's
   writer thread while it writes (qk.h's CPU streaming), so that a cancel is seen while the states
   are built or the writer is the bottleneck too. */
QK__PRIV void qk__job_poll(qk__gram_job *j)
{
    if (!j->progress) return;
    if (!qk__mutex_trylock(&j->cb_lock)) return;
    /* once cancelled, no more calls (another thread may have polled since this one looked) */
    if (!QK__LOAD(&j->cancel) && j->progress(QK__LOAD(&j->pairs_done), j->pairs_total, j->progress_user)) QK__STORE(&j->cancel, 1);
    qk__mutex_unlock(&j->cb_lock);
}

/* The state builders' polls (qk__poll above): thread 0 every QK__POLL_WORK, the others 8x. */
QK__PRIV void qk__poll_init(qk__poll *p, qk__gram_job *job, int thread)
{
    p->job = job;
    p->work = 0;
    p->every = thread == 0 ? QK__POLL_WORK : 8 * QK__POLL_WORK;
}

/* Counts work; polls when enough has been done since the last poll. 1: the job is cancelled. */
QK__PRIV int qk__poll_tick(qk__poll *p, int64_t work)
{
    if (!p->job) return 0;
    p->work += work;
    if (p->work >= p->every) {
        p->work = 0;
        qk__job_poll(p->job);
    }
    return QK__LOAD(&p->job->cancel) != 0;
}
/* >>cpu_states ---- CPU engine: states ---- */
/* The CPU engine builds each state gate by gate in two double arrays (re, im) of 2^q values: it
   is the oracle for the GPU engine, so it stays plain and obviously right; state construction is
   O(n * ops * 2^q), small next to the O(n^2 * 2^q) Gram. */
static void qk__g1(double *re, double *im, int64_t D, int q,
                   double ur0, double ui0, double ur1, double ui1,
                   double ur2, double ui2, double ur3, double ui3)
{
    /* [a0'; a1'] = [[u0 u1]; [u2 u3]] [a0; a1] on qubit q; im NULL: a real state and a real
       matrix (H, X, RY, BASIS; the imaginary parts are 0 and stay 0) */
    int64_t bit = (int64_t)1 << q, i0, i;
    if (!im) {
        for (i0 = 0; i0 < D; i0 += 2 * bit)
            for (i = i0; i < i0 + bit; i++) {
                double ar = re[i], br = re[i + bit];
                re[i] = ur0 * ar + ur1 * br;
                re[i + bit] = ur2 * ar + ur3 * br;
            }
        return;
    }
    for (i0 = 0; i0 < D; i0 += 2 * bit)
        for (i = i0; i < i0 + bit; i++) {
            int64_t j = i + bit;
            double ar = re[i], ai = im[i], br = re[j], bi = im[j];
            re[i] = ur0 * ar - ui0 * ai + ur1 * br - ui1 * bi;
            im[i] = ur0 * ai + ui0 * ar + ur1 * bi + ui1 * br;
            re[j] = ur2 * ar - ui2 * ai + ur3 * br - ui3 * bi;
            im[j] = ur2 * ai + ui2 * ar + ur3 * bi + ui3 * br;
        }
}

/* The j-th index (of D >> popcount(mask)) whose mask bits equal want: j with a zero inserted
   at each mask bit (ascending), then want. Ops on one or two qubits visit only their quarter or
   half of the state this way, without a test per amplitude. */
static int64_t qk__masked_index(int64_t j, int64_t mask, int64_t want)
{
    int64_t m = mask;
    while (m) {
        const int64_t low = m & -m;
        j = ((j & ~(low - 1)) << 1) | (j & (low - 1));
        m &= m - 1;
    }
    return j | want;
}
static int qk__popcount64(int64_t m)
{
    int n = 0;
    for (; m; m &= m - 1) n++;
    return n;
}

/* multiply amplitude i by (cr + i ci) when (i & mask) == want; im NULL: a real state, ci 0.
   The matching indices come in contiguous runs as long as the lowest mask bit's value. */
static void qk__phase(double *re, double *im, int64_t D, int64_t mask, int64_t want, double cr, double ci)
{
    const int64_t n = D >> qk__popcount64(mask), run = mask ? mask & -mask : D; /* mask 0: every amplitude */
    int64_t j, i;
    for (j = 0; j < n; j += run) {
        const int64_t i0 = qk__masked_index(j, mask, want);
        if (!im) {
            for (i = i0; i < i0 + run; i++) re[i] *= cr;
            continue;
        }
        for (i = i0; i < i0 + run; i++) {
            double ar = re[i], ai = im[i];
            re[i] = cr * ar - ci * ai;
            im[i] = cr * ai + ci * ar;
        }
    }
}

/* Ops with real matrices (a real state stays real): the CPU builder skips the imaginary parts
   until the first other op (hea(rot=y) never has one: half the flops of its states). */
static int qk__real_op(qk_op_kind k)
{
    return k == QK_OP_H || k == QK_OP_X || k == QK_OP_RY || k == QK_OP_Z || k == QK_OP_CZ || k == QK_OP_CNOT || k == QK_OP_BASIS;
}

/* Applies op o with angle t to the state (re, im) of q qubits; x is the sample (for BASIS).
   im NULL: the state is real and o one of the real ops (qk__real_op), which leave it real. */
QK__PRIV void qk__apply(const qk_op *o, double t, const double *x, double *re, double *im, int q)
{
    int64_t D = (int64_t)1 << q, i;
    double c = cos(0.5 * t), s = sin(0.5 * t), m[8];
    switch (o->kind) {
    case QK_OP_H: case QK_OP_X: case QK_OP_Y: case QK_OP_RX: case QK_OP_RY:
        qk__u1(o->kind, t, 0, m);
        qk__g1(re, im, D, o->q0, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]);
        break;
    case QK_OP_Z: qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, -1, 0); break;
    case QK_OP_RZ:
        qk__phase(re, im, D, (int64_t)1 << o->q0, 0, c, -s);
        qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, c, s);
        break;
    case QK_OP_P: qk__phase(re, im, D, (int64_t)1 << o->q0, (int64_t)1 << o->q0, cos(t), sin(t)); break;
    case QK_OP_CZ: {
        int64_t m = ((int64_t)1 << o->q0) | ((int64_t)1 << o->q1);
        qk__phase(re, im, D, m, m, -1, 0);
        break;
    }
    case QK_OP_RZZ: {
        /* e^{-it/2} where the two bits agree, e^{+it/2} where they differ */
        int64_t b0 = (int64_t)1 << o->q0, b1 = (int64_t)1 << o->q1;
        for (i = 0; i < D; i++) {
            int odd = ((i & b0) != 0) != ((i & b1) != 0);
            double ci = odd ? s : -s, ar = re[i], ai = im[i];
            re[i] = c * ar - ci * ai;
            im[i] = c * ai + ci * ar;
        }
        break;
    }
    case QK_OP_CNOT: {
        /* swap the amplitudes with the control set: target clear <-> target set, in runs of
           contiguous indices (qk__phase) */
        int64_t bc = (int64_t)1 << o->q0, bt = (int64_t)1 << o->q1, n = D >> 2, run = bc < bt ? bc : bt, j;
        for (j = 0; j < n; j += run) {
            const int64_t a0 = qk__masked_index(j, bc | bt, bc);
            for (i = a0; i < a0 + run; i++) {
                double tr = re[i];
                re[i] = re[i | bt];
                re[i | bt] = tr;
                if (im) { tr = im[i]; im[i] = im[i | bt]; im[i | bt] = tr; }
            }
        }
        break;
    }
    case QK_OP_BASIS:
        if (qk__u1(o->kind, t, qk__basis_one(x[o->angle.x0]), m))
            qk__g1(re, im, D, o->q0, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]);
        break;
    default: break; /* AMPLITUDE handled by the caller */
    }
}

/* ---- Hadamard runs: H on a set M of distinct qubits as one Walsh-Hadamard transform ----
   H^(x)M = 2^(-|M|/2) times add/subtract butterflies over the bits of M: 2 flops per amplitude
   and bit on the split (re, im) arrays, where the gate-by-gate path takes a general 2x2 complex
   matrix (14); the bits below QK__WHT_BLOCK go block by block in cache, with the scale, the
   others one pass each. A fresh |0> (the map's first ops, zz's and iqp's first layer) becomes
   the uniform superposition over M directly. */
#define QK__WHT_BLOCK 10
/* The run of H ops on distinct qubits at op k: its length, the qubits in *mask. */
static int qk__hrun(const qk_map *m, int k, int64_t *mask)
{
    int n = 0;
    int64_t M = 0;
    while (k + n < m->n_ops && m->ops[k + n].kind == QK_OP_H && !((M >> m->ops[k + n].q0) & 1)) {
        M |= (int64_t)1 << m->ops[k + n].q0;
        n++;
    }
    *mask = M;
    return n;
}
static double qk__wht_scale(int64_t M)
{
    int m = 0;
    for (; M; M &= M - 1) m++;
    return ldexp(m & 1 ? 0.70710678118654752440 : 1.0, -(m >> 1));
}
/* unnormalised butterflies on bit `bit` over amplitudes [lo, hi); im NULL: a real state */
/* the butterflies (i, i + bit) for i in [a, a + len), a range of one half-block */
static void qk__wht_pairs(double *re, double *im, int64_t a, int64_t len, int64_t bit)
{
    int64_t i;
    if (!im) {
        for (i = a; i < a + len; i++) {
            double ar = re[i], br = re[i + bit];
            re[i] = ar + br; re[i + bit] = ar - br;
        }
        return;
    }
    for (i = a; i < a + len; i++) {
        double ar = re[i], br = re[i + bit], ai = im[i], bi = im[i + bit];
        re[i] = ar + br; re[i + bit] = ar - br;
        im[i] = ai + bi; im[i + bit] = ai - bi;
    }
}
static void qk__wht_bit(double *re, double *im, int64_t lo, int64_t hi, int64_t bit)
{
    int64_t i0;
    for (i0 = lo; i0 < hi; i0 += 2 * bit) qk__wht_pairs(re, im, i0, bit, bit);
}
/* butterflies between polls in a pass of a high bit (a pass over a large state is tens of ms) */
#define QK__WHT_CHUNK ((int64_t)1 << 16)
/* poll (may be NULL): ticked per block and per pass over the state, so that a cancel stops a
   large transform part way (1: cancelled, the state half transformed) */
static int qk__wht(double *re, double *im, int q, int64_t M, qk__poll *poll)
{
    const int64_t D = (int64_t)1 << q, bs = (int64_t)1 << (q < QK__WHT_BLOCK ? q : QK__WHT_BLOCK);
    const double sc = qk__wht_scale(M);
    int64_t b0, i, bit, low = 0;
    for (bit = 1; bit < bs; bit <<= 1) low += (M & bit) != 0;
    if (M & (bs - 1)) {
        for (b0 = 0; b0 < D; b0 += bs) {
            for (bit = 1; bit < bs; bit <<= 1)
                if (M & bit) qk__wht_bit(re, im, b0, b0 + bs, bit);
            for (i = b0; i < b0 + bs; i++) { re[i] *= sc; if (im) im[i] *= sc; }
            if (poll && qk__poll_tick(poll, (low + 1) * bs)) return 1;
        }
    } else {
        for (i = 0; i < D; i++) { re[i] *= sc; if (im) im[i] *= sc; }
    }
    for (bit = bs; bit < D; bit <<= 1)
        if (M & bit) {
            int64_t s, len;
            for (b0 = 0; b0 < D; b0 += 2 * bit)
                for (s = 0; s < bit; s += QK__WHT_CHUNK) {
                    len = bit - s < QK__WHT_CHUNK ? bit - s : QK__WHT_CHUNK;
                    qk__wht_pairs(re, im, b0 + s, len, bit);
                    if (poll && qk__poll_tick(poll, 2 * len)) return 1;
                }
        }
    return 0;
}
/* H on the qubits of M applied to |0>: 2^(-|M|/2) at every index inside M */
static void qk__wht_fresh(double *re, int64_t M)
{
    const double sc = qk__wht_scale(M);
    int64_t s = M;
    for (;;) {
        re[s] = sc;
        if (!s) break;
        s = (s - 1) & M;
    }
}

/* ---- diagonal runs: a run of diagonal ops as one quadratic phase, applied by tables ----
   Z, RZ, P, CZ, RZZ and the zz pair CNOT(a,b) P(t)_b CNOT(a,b) are diagonal; a run of them is
   the phase e^{i f(b)} of the basis index b with
       f(b) = c0 + sum_i c_i b_i + sum_{i<j} d_ij b_i b_j
   (Z: pi b; RZ(t): -t/2 + t b; P(t): t b; CZ: pi b_a b_b; RZZ(t): -t/2 + t (b_a xor b_b); the
   pair: t (b_a xor b_b), and a xor b = a + b - 2ab). The index splits into g low bits l and
   q - g high bits h: f = T(l) + C_h(l) with T the low bits' own part (a table of 2^g phases
   built once per run) and C_h(l) = P_h + sum_{i<g} (sum_{j>=g} d_ij h_j) l_i, linear in l, so
   e^{i C_h} is a table of 2^g built by doubling (one complex product per entry) for each h.
   Each amplitude then takes two complex products, against one pass over the state per op
   before (a zz layer on q qubits: q (q + 1) / 2 passes). Scratch: qk__diag_scratch(q) doubles. */
#define QK__DIAG_LOW 10
/* QK__DIAG_MIN_QUBITS: in qk_internal.h */
QK__PRIV size_t qk__diag_scratch(int q)
{
    return 2 * ((size_t)q + (size_t)q * (size_t)q) + ((size_t)4 << QK__DIAG_LOW);
}

/* Length (in ops) of the diagonal op at k: 3 for a CNOT-D-CNOT parity op (qk__parity_at, the
   rule of every engine), 1 for a diagonal op, 0 otherwise. */
static int qk__diag_len(const qk_map *m, int k)
{
    const qk_op *o = &m->ops[k];
    if (qk__op_diag1(o->kind) || o->kind == QK_OP_CZ || o->kind == QK_OP_RZZ) return 1;
    if (qk__parity_at(m->ops, m->n_ops, k)) return 3;
    return 0;
}

/* Phases are summed without rounding error (two-sum: hi + lo) and reduced mod 2 pi before one
   cos/sin, so a phase summed from many angles (a zz layer on 14 qubits: |f| up to ~10^3) is as
   accurate as one angle: op by op, every op's rotation rounds once. */
static void qk__dd_add(double *hi, double *lo, double b)
{
    double s = *hi + b, bb = s - *hi;
    *lo += (*hi - (s - bb)) + (b - bb);
    *hi = s;
}

static double qk__dd_mod2pi(double hi, double lo)
{
    const double P2H = 6.283185307179586232, P2L = 2.4492935982947064e-16;
    double k = floor(hi / P2H + 0.5);
    return fma(-k, P2H, hi) + (lo - k * P2L);
}

/* Applies the diagonal ops [k0, k1) (whole ops of qk__diag_len) to the state. */
/* poll (may be NULL): ticked per block of 2^g amplitudes (1: cancelled, the phase half applied) */
static int qk__diag_run(const qk_map *m, int k0, int k1, const double *theta, double *re, double *im, int q, double *w, qk__poll *poll)
{
    const double PI = 3.14159265358979323846;
    const int g = q < QK__DIAG_LOW ? q : QK__DIAG_LOW;
    const int64_t G = (int64_t)1 << g, H = (int64_t)1 << (q - g);
    /* coefficients as hi/lo pairs while they are summed, then reduced into c[i], d[i * q + j] */
    double *c = w, *d = w + q, *cl = d + q * q, *dl = cl + q;
    double *tr = dl + q * q, *ti = tr + G;   /* e^{i T(l)} */
    double *hr = ti + G, *hi = hr + G;       /* e^{i C_h(l)} */
    double c0 = 0.0, c0l = 0.0;
    int64_t h, l;
    int k, i, j;
    memset(w, 0, sizeof(double) * 2 * (size_t)(q + q * q));
    for (k = k0; k < k1; k += qk__diag_len(m, k)) {
        const qk_op *o = &m->ops[k];
        const int a = o->q0, b = o->q1, ij = (a < b ? a : b) * q + (a < b ? b : a);
        double t = theta[k];
        switch (o->kind) {
        case QK_OP_Z: qk__dd_add(&c[a], &cl[a], PI); break;
        case QK_OP_RZ: qk__dd_add(&c0, &c0l, -0.5 * t); qk__dd_add(&c[a], &cl[a], t); break;
        case QK_OP_P: qk__dd_add(&c[a], &cl[a], t); break;
        case QK_OP_CZ: qk__dd_add(&d[ij], &dl[ij], PI); break;
        default: /* RZZ(t): -t/2 + t (a xor b); CNOT D CNOT: D's phases on the bit a xor b, Z: pi
                    (a xor b), RZ(t): -t/2 + t (a xor b), P(t): t (a xor b); a xor b = a + b - 2ab */
            if (o->kind == QK_OP_RZZ) qk__dd_add(&c0, &c0l, -0.5 * t);
            else {
                t = o[1].kind == QK_OP_Z ? PI : theta[k + 1];
                if (o[1].kind == QK_OP_RZ) qk__dd_add(&c0, &c0l, -0.5 * t);
            }
            qk__dd_add(&c[a], &cl[a], t);
            qk__dd_add(&c[b], &cl[b], t);
            qk__dd_add(&d[ij], &dl[ij], -2.0 * t);
            break;
        }
    }
    for (i = 0; i < q; i++) {
        c[i] = qk__dd_mod2pi(c[i], cl[i]);
        for (j = i + 1; j < q; j++) d[i * q + j] = qk__dd_mod2pi(d[i * q + j], dl[i * q + j]);
    }
    c0 = qk__dd_mod2pi(c0, c0l);
    for (l = 0; l < G; l++) {
        double f = c0, fl = 0.0;
        for (i = 0; i < g; i++) {
            if (!((l >> i) & 1)) continue;
            qk__dd_add(&f, &fl, c[i]);
            for (j = i + 1; j < g; j++) if ((l >> j) & 1) qk__dd_add(&f, &fl, d[i * q + j]);
        }
        f = qk__dd_mod2pi(f, fl);
        tr[l] = cos(f);
        ti[l] = sin(f);
    }
    for (h = 0; h < H; h++) {
        double ph = 0.0, phl = 0.0;
        int64_t span;
        double *ar = re + h * G, *ai = im + h * G;
        for (j = g; j < q; j++) {
            if (!((h >> (j - g)) & 1)) continue;
            qk__dd_add(&ph, &phl, c[j]);
            for (k = j + 1; k < q; k++) if ((h >> (k - g)) & 1) qk__dd_add(&ph, &phl, d[j * q + k]);
        }
        ph = qk__dd_mod2pi(ph, phl);
        hr[0] = cos(ph);
        hi[0] = sin(ph);
        for (i = 0, span = 1; i < g; i++, span <<= 1) {
            double lin = 0.0, linl = 0.0, er, ei;
            for (j = g; j < q; j++) if ((h >> (j - g)) & 1) qk__dd_add(&lin, &linl, d[i * q + j]);
            lin = qk__dd_mod2pi(lin, linl);
            er = cos(lin); ei = sin(lin);
            for (l = 0; l < span; l++) {
                hr[span + l] = hr[l] * er - hi[l] * ei;
                hi[span + l] = hr[l] * ei + hi[l] * er;
            }
        }
        for (l = 0; l < G; l++) {
            double fr = tr[l] * hr[l] - ti[l] * hi[l], fi = tr[l] * hi[l] + ti[l] * hr[l];
            double xr = ar[l], xi = ai[l];
            ar[l] = fr * xr - fi * xi;
            ai[l] = fr * xi + fi * xr;
        }
        if (poll && qk__poll_tick(poll, 2 * G)) return 1;
    }
    return 0;
}

/* A given state's row (qk_gram_states' map, op o) into re / im (zero-padded past dim by the
   caller), unchanged (the bits of the caller's amplitudes), or scaled to norm 1 where the op's
   flags ask for it. */
static void qk__state_row(const qk_op *o, const double *x, double *re, double *im)
{
    const int type = o->q0;
    const int64_t dim = o->angle.x0;
    int64_t k;
    double ss = 0.0, inv;
    if (o->q1 & QK__STATE_MIXED) {   /* a density matrix: [Re rho | Im rho] (real types: Re rho) */
        const int64_t d2 = dim * dim;
        double tr = 0.0;
        for (k = 0; k < d2; k++) qk__state_amp(x, type, k, &re[k], qk__state_complex(type) ? &re[d2 + k] : &ss);
        if (!(o->q1 & QK__STATE_NORMALIZE)) return;
        for (k = 0; k < dim; k++) tr += re[k * dim + k];
        inv = 1.0 / tr;
        for (k = 0; k < (qk__state_complex(type) ? 2 * d2 : d2); k++) re[k] *= inv;
        QK__UNUSED(im);
        return;
    }
    switch (type) {
    case QK_STATE_C128: for (k = 0; k < dim; k++) { re[k] = x[2 * k]; im[k] = x[2 * k + 1]; } break;
    case QK_STATE_C64: {
        const float *f = (const float *)(const void *)x;
        for (k = 0; k < dim; k++) { re[k] = f[2 * k]; im[k] = f[2 * k + 1]; }
        break;
    }
    case QK_STATE_F64: memcpy(re, x, sizeof(double) * (size_t)dim); break;
    default: {
        const float *f = (const float *)(const void *)x;
        for (k = 0; k < dim; k++) re[k] = f[k];
        break;
    }
    }
    if (!(o->q1 & QK__STATE_NORMALIZE)) return;
    for (k = 0; k < dim; k++) ss += re[k] * re[k] + im[k] * im[k];
    inv = 1.0 / sqrt(ss);
    for (k = 0; k < dim; k++) { re[k] *= inv; im[k] *= inv; }
}

/* ---- cancel while states are built ---- */

/* One state into re/im (2^q each). theta: scratch of n_ops + 1 + qk__diag_scratch(q) doubles.
   Data already validated. poll (may be NULL): a tick per op; on a cancel the state is left
   half built (the caller discards it). */
QK__PRIV void qk__state1(const qk_map *m, const double *x, double *re, double *im, double *theta, qk__poll *poll)
{
    int q = m->n_qubits, k;
    int64_t D = (int64_t)1 << q, i;
    int first = 0, cplx = 0; /* cplx: some op made the state complex (before: im is all 0) */
    memset(re, 0, sizeof(double) * (size_t)D);
    memset(im, 0, sizeof(double) * (size_t)D);
    if (m->n_ops > 0 && m->ops[0].kind == QK__OP_STATE) {   /* given states: as they are, or scaled */
        qk__state_row(&m->ops[0], x, re, im);
        return;
    }
    if (m->n_ops > 0 && m->ops[0].kind == QK_OP_AMPLITUDE) {
        double ss = 0.0, inv;
        for (k = 0; k < m->n_features; k++) ss += x[k] * x[k];
        inv = 1.0 / sqrt(ss);
        for (k = 0; k < m->n_features; k++) re[k] = x[k] * inv;
        first = 1;
    } else {
        re[0] = 1.0;
    }
    qk_map_angles(m, x, theta);
    for (k = first; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        int k1 = k, nd = 0;
        int64_t hm;
        double *imc = cplx ? im : NULL; /* the imaginary parts, where they are not all 0 */
        /* a run of diagonal ops with at least three passes' worth: one table pass (above) */
        int angled = 0;
        /* a run of Hadamards on distinct qubits: one transform (above); on the fresh |0> (op 0,
           re[0] = 1, the rest 0) the superposition it makes */
        int nh = qk__hrun(m, k, &hm);
        if (nh >= 2) {
            if (k == 0) {
                qk__wht_fresh(re, hm);
                if (poll && qk__poll_tick(poll, (int64_t)nh * D / 4)) return;
            } else if (qk__wht(re, imc, q, hm, poll)) {
                return;
            }
            k += nh - 1;
            continue;
        }
        while (q >= QK__DIAG_MIN_QUBITS && k1 < m->n_ops && qk__diag_len(m, k1)) {
            const int dl = qk__diag_len(m, k1);
            const qk_op_kind dk = m->ops[k1 + (dl == 3)].kind;   /* a parity op's D */
            angled |= dk != QK_OP_Z && dk != QK_OP_CZ; /* Z, CZ (and CX Z CX) alone: exact -1 op by op */
            k1 += dl;
            nd++;
        }
        if (nd >= 3 && q >= QK__DIAG_MIN_QUBITS && angled) {
            cplx = 1;
            if (qk__diag_run(m, k, k1, theta, re, im, q, theta + m->n_ops + 1, poll)) return;
            k = k1 - 1;
            continue;
        }
        /* CNOT(a,b) D_b CNOT(a,b) (qk__parity_at; every zz pair is CX P CX) is D's diagonal
           taken on the bit a xor b: D's m00 where bits a and b agree, m11 where they differ (P:
           1 and e^{it}, the agreeing half left as it is): one pass instead of three */
        if (qk__parity_at(m->ops, m->n_ops, k)) {
            int64_t ba = (int64_t)1 << o->q0, bb = (int64_t)1 << o->q1;
            double u[8];
            int same, p;
            (void)qk__u1(o[1].kind, theta[k + 1], 0, u);
            same = u[0] == 1.0 && u[1] == 0.0;   /* m00 = 1 (P): the agreeing half stays */
            cplx = 1;
            for (i = 0; i < D; i++) {
                p = ((i & ba) != 0) != ((i & bb) != 0);
                if (p || !same) {
                    const double c = u[p ? 6 : 0], s = u[p ? 7 : 1], ar = re[i], ai = im[i];
                    re[i] = c * ar - s * ai;
                    im[i] = c * ai + s * ar;
                }
            }
            k += 2;
            if (poll && qk__poll_tick(poll, D)) return;
            continue;
        }
        if (!qk__real_op(o->kind)) cplx = 1;
        qk__apply(o, theta[k], x, re, cplx ? im : NULL, q);
        if (poll && qk__poll_tick(poll, D)) return;
    }
}

/* Product maps: the 2-vector of each qubit (u0, u1 complex) after its one-qubit ops, applied to
   |0>. out: q * 4 doubles per qubit in the shared layout (QK__QV_*). */
QK__PRIV void qk__product1(const qk_map *m, const double *x, double *out, double *theta)
{
    int q = m->n_qubits, k;
    for (k = 0; k < q; k++) {
        double *v = out + 4 * k;
        v[QK__QV_RE0] = 1; v[QK__QV_IM0] = 0; v[QK__QV_RE1] = 0; v[QK__QV_IM1] = 0;
    }
    qk_map_angles(m, x, theta);
    for (k = 0; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        double *v = out + 4 * o->q0, re[2], im[2];
        qk_op local = *o;
        local.q0 = 0;
        re[0] = v[QK__QV_RE0]; re[1] = v[QK__QV_RE1]; im[0] = v[QK__QV_IM0]; im[1] = v[QK__QV_IM1];
        qk__apply(&local, theta[k], x, re, im, 1);
        v[QK__QV_RE0] = re[0]; v[QK__QV_RE1] = re[1]; v[QK__QV_IM0] = im[0]; v[QK__QV_IM1] = im[1];
    }
}


/* >>cpu_gram ---- CPU engine: states for many samples, the blocked Gram tiles ---- */
/* ---- states for many samples, in the CPU engine's layout ---- */
/* complex: row r = [re(D) | im(D)]; real: row r = [re(D)]; product: row r = q * 4 doubles */
typedef struct qk__states_job {
    const qk_map *map;
    const double *x;
    int64_t n;
    qk_path path;
    double *out;
    int64_t stride;
    int64_t next;
    int oom;
    struct qk__gram_job *job;   /* NULL, or the job whose progress and cancel to poll */
} qk__states_job;

static void qk__states_work(void *p, int thread)
{
    qk__states_job *j = (qk__states_job *)p;
    const qk_map *m = j->map;
    int q = m->n_qubits;
    int64_t D = (j->path == QK_PATH_ANALYTIC) ? 0 : ((int64_t)1 << q), r;
    double *theta = (double *)qk__malloc(sizeof(double) * ((size_t)m->n_ops + 1 + qk__diag_scratch(q)));
    double *im = NULL;
    qk__poll poll;
    qk__poll_init(&poll, j->job, thread);
    if (j->path == QK_PATH_REAL) im = (double *)qk__malloc(sizeof(double) * (size_t)D);
    if (!theta || (j->path == QK_PATH_REAL && !im)) { QK__STORE(&j->oom, 1); QK_FREE(theta); QK_FREE(im); return; }
    while ((r = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *x = j->x + r * m->n_features;
        double *row = j->out + r * j->stride;
        if (QK__LOAD(&j->oom)) break;
        if (j->path == QK_PATH_ANALYTIC) {
            qk__product1(m, x, row, theta);
            if (qk__poll_tick(&poll, 16 * ((int64_t)m->n_ops + 1))) break;   /* ~1 ns per unit, as amplitudes */
        } else {
            /* a tick per op from 2^14 amplitudes (a pass: ~10 us and up); below, one per sample
               (per-op ticks cost 30% at 10 qubits, 2-core dev machine, zz reps=2) */
            qk__poll *pp = q >= QK__POLL_OP_QUBITS ? &poll : NULL;
            if (j->path == QK_PATH_REAL) qk__state1(m, x, row, im, theta, pp);   /* im stays 0 */
            else qk__state1(m, x, row, row + D, theta, pp);
            if (qk__poll_tick(&poll, pp ? D : D * ((int64_t)m->n_ops + 1))) break;
        }
    }
    QK_FREE(theta);
    QK_FREE(im);
}

QK__PRIV qk_path qk__path_of(const qk_map *m)
{
    return m->cls == QK_CLASS_PRODUCT ? QK_PATH_ANALYTIC : m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
}

QK__PRIV int64_t qk__row_len(const qk_map *m, qk_path path)
{
    int64_t D = (int64_t)1 << (m->n_qubits > 62 ? 0 : m->n_qubits);
    return path == QK_PATH_ANALYTIC ? 4 * (int64_t)m->n_qubits : path == QK_PATH_REAL ? D : 2 * D;
}

/* Builds n rows into out (n x qk__row_len doubles); 0, or -1 (error set) when the builders'
   scratch cannot be allocated. job (may be NULL): the job whose progress callback is polled
   meanwhile; where it cancels, the builders stop and out is left half built (the caller sees
   job->cancel and discards it). */
static int qk__cpu_states_rows(const qk_map *m, const double *x, int64_t n, qk_path path, int n_threads, double *out,
                               struct qk__gram_job *job)
{
    qk__states_job j;
    memset(&j, 0, sizeof j);
    j.map = m; j.x = x; j.n = n; j.path = path; j.out = out; j.stride = qk__row_len(m, path); j.job = job;
    QK_PROF_BEGIN("states");
    qk__parallel(n_threads < n ? n_threads : (int)n, qk__states_work, &j);
    QK_PROF_END("states");
    if (j.oom) { qk__set_error("states: out of host memory"); return -1; }
    return 0;
}

/* Rows [row0, row0 + n) of the data X (desc->x or desc->y, n_features doubles a row) into out.
   Given states with a provider (qk_gram_states): X is a tag (qk__smap: its side and first row),
   and the rows come from the provider in chunks into the map's buffer, checked, then built as
   stored rows. */
static int qk__cpu_states_into(const qk_map *m, const double *X, int64_t row0, int64_t n, qk_path path, int n_threads,
                               double *out, struct qk__gram_job *job)
{
    qk__smap *sm;
    int tag, side;
    int64_t c, stride;
    if (!qk__map_is_states(m) || !(m->ops[0].q1 & QK__STATE_PROVIDER))
        return qk__cpu_states_rows(m, X + row0 * m->n_features, n, path, n_threads, out, job);
    sm = (qk__smap *)(void *)(uintptr_t)(const void *)m;
    tag = (const char *)(const void *)X == &sm->side[1];
    side = sm->tag_side[tag];
    row0 += sm->tag_row0[tag];   /* the tag's first row (a block of K under qk_gram_mpi_states) */
    stride = qk__row_len(m, path);
    for (c = 0; c < n; c += sm->chunk) {
        const int64_t k = n - c < sm->chunk ? n - c : sm->chunk;
        const qk_result r = qk__smap_fetch(sm, side, row0 + c, k, sm->buf);
        if (r != QK_OK) {
            if (job) { job->provider_failed = r; QK__STORE(&job->cancel, 1); }
            return -1;
        }
        if (qk__cpu_states_rows(m, (const double *)sm->buf, k, path, n_threads, out + c * stride, job) != 0) return -1;
    }
    return 0;
}

/* The result of a failed qk__cpu_states_into: the provider's error (set), or out of memory. */
static qk_result qk__states_failed(const qk__gram_job *j)
{
    return j && j->provider_failed ? j->provider_failed : QK_ERROR_OUT_OF_MEMORY;
}

/* Builds n rows; returns NULL (and sets the error) when memory runs out. job: as for
   qk__cpu_states_into (a cancelled job's rows are half built). */
QK__PRIV double *qk__cpu_states(const qk_map *m, const double *x, int64_t row0, int64_t n, qk_path path, int n_threads,
                                struct qk__gram_job *job)
{
    int64_t stride = qk__row_len(m, path);
    double *out;
    if ((double)n * (double)stride * 8.0 > 9.0e18) { qk__set_error("states: %lld x %lld doubles overflow", (long long)n, (long long)stride); return NULL; }
    out = (double *)qk__malloc(sizeof(double) * (size_t)(n * stride));
    if (!out) { qk__set_error("states: cannot allocate %.3g GB of host memory for %lld states", (double)n * (double)stride * 8e-9, (long long)n); return NULL; }
    if (qk__cpu_states_into(m, x, row0, n, path, n_threads, out, job) != 0) { QK_FREE(out); return NULL; }
    return out;
}

/* ---- blocked Gram ---- */
/* Tiles of QK__T x QK__T pairs; inside a tile, micro-kernels of QK__NI rows x QK__NJ columns with
   the column panel packed [d][re NJ | im NJ] so the inner loop is NJ-wide FMAs (one zmm with
   AVX-512, two ymm with AVX2), the row values broadcast. The d range is split into chunks of
   QK__DC so a packed panel (QK__DC * 2 * QK__NJ doubles = 32 KiB) stays in L1/L2 for 16+ qubits.
   Measured on the 2-core dev machine (docs/benchmarks.md). */
/* QK__T, QK__NI, QK__DC, QK__TR: in qk_internal.h (the planner sizes with them) */

/* the Gram job (qk__gram_job) and its polls are in cpu_pool.c (the types in qk_internal.h) */

/* tile t -> (ti, tj); symmetric: only tj >= ti, row by row */
static void qk__tile_of(const qk__gram_job *j, int64_t t, int64_t *ti, int64_t *tj)
{
    if (!j->symmetric) { *ti = j->ti_begin + t / j->tiles_j; *tj = t % j->tiles_j; return; }
    if (j->ti_begin > 0 || j->ti_end < j->tiles_i) {
        /* a slab: a few tile rows, walked */
        int64_t i = j->ti_begin;
        while (t >= j->tiles_j - i) { t -= j->tiles_j - i; i++; }
        *ti = i;
        *tj = i + t;
        return;
    }
    {
        int64_t T = j->tiles_i, i = 0, rowlen = T;
        /* rows have T, T-1, ... tiles; the count is small enough for a closed form */
        double a = (double)(2 * T + 1), disc = a * a - 8.0 * (double)t;
        i = (int64_t)floor((a - sqrt(disc > 0 ? disc : 0)) / 2.0);
        if (i < 0) i = 0;
        while (i > 0 && i * T - i * (i - 1) / 2 > t) i--;
        while ((i + 1) * T - (i + 1) * i / 2 <= t) i++;
        rowlen = i * T - i * (i - 1) / 2;
        *ti = i;
        *tj = i + (t - rowlen);
    }
}

/* The micro-kernels use GCC/Clang vector extensions; other compilers get the plain loops below.
   A micro-kernel's 2 x QK__NI accumulators (QK__NJ = 8 columns each) must stay in registers:
   12 zmm with AVX-512 (32 registers), but 8 doubles are two ymm with AVX2 and four xmm with SSE2
   (16 registers), and 24 or 48 of them spill on every FMA. So a kernel walks the 8 columns in
   slices of one hardware vector (QK__MK_W doubles: 8 with AVX-512, 4 with AVX or on AArch64, 2
   otherwise), each slice over the whole chunk of d; an entry sums its d terms in the same order
   whatever the slice width, so K does not depend on it (FMA contraction, which the instruction
   set decides, does change the last bits). GCC in ISO C mode (-std=c11) does not contract a*b+c
   into an FMA; QK__CONTRACT turns contraction on for these functions only (2x on the dev machine).

   Runtime dispatch (QK__DISPATCH, qk_internal.h: x86-64, GCC or Clang, a target without AVX2,
   and no QK_NO_DISPATCH): a portable build (a Python wheel, a distribution's package: plain
   x86-64, SSE2) also compiles the kernels for AVX2 + FMA and for AVX-512F (target attributes) and
   each Gram job uses the instruction set qk__cpu_isa chose (the best the CPU has, QK_CPU_ISA,
   qk_cpu_isa_set; cpu_pool.c). Builds for a target with AVX2 (-march=native, -Dnative=true) use
   the one their target gives, without dispatch. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT)
/* QK__VEC, qk__v8, qk__v4, qk__v2, QK__CONTRACT, QK__LD8, QK__ST8, QK__ADD8: in qk_internal.h (the MPS engine uses them) */

/* Defines NAME##_complex and NAME##_real for slices of W doubles (vector type VT), with the
   function attributes ATTR. */
#define QK__MK_DEFINE(NAME, ATTR, VT, W)                                                            \
    QK__CONTRACT ATTR static void NAME##_complex(const double *ap, const double *bp, int64_t dc,     \
                                                 double *accr, double *acci)                        \
    {                                                                                               \
        int a, h;                                                                                   \
        int64_t d;                                                                                  \
        for (h = 0; h < QK__NJ; h += (W)) {                                                         \
            VT r[QK__NI], im[QK__NI], z, t;                                                         \
            memset(&z, 0, sizeof z);                                                                \
            for (a = 0; a < QK__NI; a++) { r[a] = z; im[a] = z; }                                   \
            for (d = 0; d < dc; d++) {                                                              \
                VT br, bi;                                                                          \
                const double *x = ap + d * 2 * QK__NI;                                              \
                memcpy(&br, bp + d * 2 * QK__NJ + h, sizeof br);                                    \
                memcpy(&bi, bp + d * 2 * QK__NJ + QK__NJ + h, sizeof bi);                           \
                for (a = 0; a < QK__NI; a++) {                                                      \
                    r[a] += x[a] * br; im[a] += x[a] * bi;                                          \
                    r[a] += x[QK__NI + a] * bi; im[a] -= x[QK__NI + a] * br;                        \
                }                                                                                   \
            }                                                                                       \
            for (a = 0; a < QK__NI; a++) {                                                          \
                memcpy(&t, accr + a * QK__T + h, sizeof t); t += r[a];                              \
                memcpy(accr + a * QK__T + h, &t, sizeof t);                                         \
                memcpy(&t, acci + a * QK__T + h, sizeof t); t += im[a];                             \
                memcpy(acci + a * QK__T + h, &t, sizeof t);                                         \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    QK__CONTRACT ATTR static void NAME##_real(const double *ap, const double *bp, int64_t dc, double *accr) \
    {                                                                                               \
        int a, h;                                                                                   \
        int64_t d;                                                                                  \
        for (h = 0; h < QK__NJ; h += (W)) {                                                         \
            VT r[QK__NI], z, t;                                                                     \
            memset(&z, 0, sizeof z);                                                                \
            for (a = 0; a < QK__NI; a++) r[a] = z;                                                  \
            for (d = 0; d < dc; d++) {                                                              \
                VT b;                                                                               \
                const double *x = ap + d * QK__NI;                                                  \
                memcpy(&b, bp + d * QK__NJ + h, sizeof b);                                          \
                for (a = 0; a < QK__NI; a++) r[a] += x[a] * b;                                      \
            }                                                                                       \
            for (a = 0; a < QK__NI; a++) {                                                          \
                memcpy(&t, accr + a * QK__T + h, sizeof t); t += r[a];                              \
                memcpy(accr + a * QK__T + h, &t, sizeof t);                                         \
            }                                                                                       \
        }                                                                                           \
    }

#if defined(__AVX512F__)
QK__MK_DEFINE(qk__mk, , qk__v8, 8)
#elif defined(__AVX__) || defined(__aarch64__)
QK__MK_DEFINE(qk__mk, , qk__v4, 4)
#else
QK__MK_DEFINE(qk__mk, , qk__v2, 2)
#endif

#if defined(QK__DISPATCH)
QK__MK_DEFINE(qk__mk_avx2, __attribute__((target("avx2,fma"))), qk__v4, 4)
QK__MK_DEFINE(qk__mk_avx512, __attribute__((target("avx512f,fma"))), qk__v8, 8)
#endif
#undef QK__MK_DEFINE

static void qk__mk_complex_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mk_avx512_complex(ap, bp, dc, accr, acci); return; }
    if (isa == QK__ISA_AVX2) { qk__mk_avx2_complex(ap, bp, dc, accr, acci); return; }
#endif
    (void)isa;
    qk__mk_complex(ap, bp, dc, accr, acci);
}

static void qk__mk_real_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mk_avx512_real(ap, bp, dc, accr); return; }
    if (isa == QK__ISA_AVX2) { qk__mk_avx2_real(ap, bp, dc, accr); return; }
#endif
    (void)isa;
    qk__mk_real(ap, bp, dc, accr);
}
#else
static void qk__mk_complex_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr, double *acci)
{
    double r[QK__NI][QK__NJ], im[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    (void)isa;
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) { r[a][b] = 0; im[a][b] = 0; }
    for (d = 0; d < dc; d++) {
        const double *br = bp + d * 2 * QK__NJ, *bi = br + QK__NJ, *x = ap + d * 2 * QK__NI;
        for (a = 0; a < QK__NI; a++) {
            double xr = x[a], xi = x[QK__NI + a];
            for (b = 0; b < QK__NJ; b++) {
                r[a][b] += xr * br[b] + xi * bi[b];
                im[a][b] += xr * bi[b] - xi * br[b];
            }
        }
    }
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) { accr[a * QK__T + b] += r[a][b]; acci[a * QK__T + b] += im[a][b]; }
}

static void qk__mk_real_isa(int isa, const double *ap, const double *bp, int64_t dc, double *accr)
{
    double r[QK__NI][QK__NJ];
    int a, b;
    int64_t d;
    (void)isa;
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) r[a][b] = 0;
    for (d = 0; d < dc; d++) {
        const double *br = bp + d * QK__NJ, *x = ap + d * QK__NI;
        for (a = 0; a < QK__NI; a++)
            for (b = 0; b < QK__NJ; b++) r[a][b] += x[a] * br[b];
    }
    for (a = 0; a < QK__NI; a++)
        for (b = 0; b < QK__NJ; b++) accr[a * QK__T + b] += r[a][b];
}
#endif

/* K of the tile rows [i0, i0+m) x cols [j0, j0+n) into kt (m x n, ld QK__T), values |<a|b>|^2 */
static void qk__tile_values(const qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n,
                            double *accr, double *acci, double *panel, double *apack, double *kt, int isa)
{
    if (j->path == QK_PATH_MPS) { j->mps_tile(j, i0, j0, m, n, apack + (size_t)QK__TR * QK__DC * 2, kt); return; }
    int64_t a, b;
    if (j->path == QK_PATH_ANALYTIC) {
        int64_t q = j->D, k;
        for (a = 0; a < m; a++) {
            const double *u = j->A + (i0 + a) * j->stride;
            for (b = 0; b < n; b++) {
                const double *v = j->B + (j0 + b) * j->stride;
                double prod = 1.0;
                for (k = 0; k < q; k++) {
                    const double *x = u + 4 * k, *y = v + 4 * k;
                    /* conj(x) . y (layout QK__QV_*) */
                    double re = x[QK__QV_RE0] * y[QK__QV_RE0] + x[QK__QV_RE1] * y[QK__QV_RE1] +
                                x[QK__QV_IM0] * y[QK__QV_IM0] + x[QK__QV_IM1] * y[QK__QV_IM1];
                    double im = x[QK__QV_RE0] * y[QK__QV_IM0] + x[QK__QV_RE1] * y[QK__QV_IM1] -
                                x[QK__QV_IM0] * y[QK__QV_RE0] - x[QK__QV_IM1] * y[QK__QV_RE1];
                    prod *= re * re + im * im;
                }
                kt[a * QK__T + b] = prod;
            }
        }
        return;
    }
    {
        int cplx = j->path == QK_PATH_COMPLEX;
        int64_t D = j->D, d0, jp, ip, c;
        for (a = 0; a < QK__TR; a++)
            for (b = 0; b < QK__T; b++) { accr[a * QK__T + b] = 0; acci[a * QK__T + b] = 0; }
        for (d0 = 0; d0 < D; d0 += QK__DC) {
            int64_t dc = D - d0 < QK__DC ? D - d0 : QK__DC;
            int w = cplx ? 2 : 1;
            /* pack the tile's rows: groups of NI rows, [d][re NI | im NI]; rows past m are zero */
            for (ip = 0; ip < m; ip += QK__NI) {
                double *dst = apack + ip * dc * w;
                for (c = 0; c < QK__NI; c++) {
                    int64_t d;
                    if (ip + c < m) {
                        const double *sr = j->A + (i0 + ip + c) * j->stride + d0, *si = sr + D;
                        for (d = 0; d < dc; d++) dst[d * w * QK__NI + c] = sr[d];
                        if (cplx) for (d = 0; d < dc; d++) dst[d * 2 * QK__NI + QK__NI + c] = si[d];
                    } else {
                        for (d = 0; d < dc; d++) dst[d * w * QK__NI + c] = 0;
                        if (cplx) for (d = 0; d < dc; d++) dst[d * 2 * QK__NI + QK__NI + c] = 0;
                    }
                }
            }
            for (jp = 0; jp < n; jp += QK__NJ) {
                /* pack columns jp..jp+NJ (zero past n) */
                for (c = 0; c < QK__NJ; c++) {
                    int64_t col = jp + c, d;
                    if (col < n) {
                        const double *br = j->B + (j0 + col) * j->stride + d0;
                        const double *bi = br + D;
                        if (cplx) for (d = 0; d < dc; d++) { panel[d * 2 * QK__NJ + c] = br[d]; panel[d * 2 * QK__NJ + QK__NJ + c] = bi[d]; }
                        else for (d = 0; d < dc; d++) panel[d * QK__NJ + c] = br[d];
                    } else {
                        if (cplx) for (d = 0; d < dc; d++) { panel[d * 2 * QK__NJ + c] = 0; panel[d * 2 * QK__NJ + QK__NJ + c] = 0; }
                        else for (d = 0; d < dc; d++) panel[d * QK__NJ + c] = 0;
                    }
                }
                for (ip = 0; ip < m; ip += QK__NI) {
                    const double *ap = apack + ip * dc * w;
                    if (cplx) qk__mk_complex_isa(isa, ap, panel, dc, accr + ip * QK__T + jp, acci + ip * QK__T + jp);
                    else qk__mk_real_isa(isa, ap, panel, dc, accr + ip * QK__T + jp);
                }
            }
        }
        for (a = 0; a < m; a++)
            for (b = 0; b < n; b++) {
                double re = accr[a * QK__T + b], im = cplx ? acci[a * QK__T + b] : 0.0;
                kt[a * QK__T + b] = j->linear ? re : re * re + im * im;
            }
    }
}

static void qk__store(void *out, qk_dtype dt, int64_t idx, double v)
{
    if (dt == QK_F32) ((float *)out)[idx] = (float)v;
    else ((double *)out)[idx] = v;
}


static void qk__gram_work(void *p, int thread)
{
    qk__gram_job *j = (qk__gram_job *)p;
    size_t esz = j->dt == QK_F32 ? 4 : 8;
    /* accr, acci: QK__TR x QK__T (rows padded to a multiple of QK__NI); kt: QK__T x QK__T;
       panel: QK__DC x 2 x QK__NJ; apack: QK__TR x QK__DC x 2 */
    double *accr = (double *)qk__malloc(sizeof(double) * ((size_t)QK__TR * QK__T * 2 + QK__T * QK__T +
                                                          QK__DC * 2 * QK__NJ + (size_t)QK__TR * QK__DC * 2 + j->scratch));
    void *cb = j->output == QK_OUTPUT_CALLBACK ? qk__malloc(esz * QK__T * QK__T) : NULL;
    double *acci, *kt, *panel, *apack;
    int64_t t;
    unsigned polls = 0;
    const int isa = j->isa;   /* the micro-kernels' instruction set (dispatch: above) */
    if (!accr || (j->output == QK_OUTPUT_CALLBACK && !cb)) { QK__STORE(&j->oom, 1); QK_FREE(accr); QK_FREE(cb); return; }
    acci = accr + QK__TR * QK__T;
    kt = acci + QK__TR * QK__T;
    panel = kt + QK__T * QK__T;
    apack = panel + QK__DC * 2 * QK__NJ;
    if (thread > 0) QK_PROF_THREAD_NAME("qk cpu worker");
    while ((t = QK__FETCH_ADD(&j->next, 1)) < j->n_tiles) {
        int64_t ti, tj, i0, j0, m, n, a, b;
        int diag;
        if (QK__LOAD(&j->cancel) || QK__LOAD(&j->oom)) break;
        QK_PROF_BEGIN("gram tile");
        qk__tile_of(j, t, &ti, &tj);
        i0 = ti * QK__T; j0 = tj * QK__T;
        m = j->na - i0 < QK__T ? j->na - i0 : QK__T;
        n = j->nb - j0 < QK__T ? j->nb - j0 : QK__T;
        diag = j->symmetric && ti == tj;
        qk__tile_values(j, i0, j0, m, n, accr, acci, panel, apack, kt, isa);
        /* cancelled meanwhile: the MPS chain may have stopped half way; no unfinished tile is stored */
        if (QK__LOAD(&j->cancel)) { QK_PROF_END("gram tile"); break; }
        if (diag) /* one value per unordered pair: K is exactly symmetric */
            for (a = 0; a < m; a++)
                for (b = 0; b < a; b++) kt[a * QK__T + b] = kt[b * QK__T + a];
        if (j->output == QK_OUTPUT_CALLBACK) {
            int stop;
            for (a = 0; a < m; a++)
                for (b = 0; b < n; b++) qk__store(cb, j->dt, a * n + b, kt[a * QK__T + b]);
            qk__mutex_lock(&j->cb_lock);
            stop = QK__LOAD(&j->cancel) ? 1 : j->tile_fn(i0 + j->i_base, j0 + j->j_base, m, n, cb, n, j->tile_user);
            qk__mutex_unlock(&j->cb_lock);
            if (stop) QK__STORE(&j->cancel, 1);
        } else {
            int mirror = j->symmetric && !diag && j0 < j->mirror_end;
            int64_t r0 = i0 - j->row_base;
            for (a = 0; a < m; a++)
                for (b = 0; b < n; b++) {
                    double v = kt[a * QK__T + b];
                    qk__store(j->out, j->dt, (r0 + a) * j->ld + j0 + b, v);
                    if (mirror) qk__store(j->out, j->dt, (j0 - j->row_base + b) * j->ld + i0 + a, v);
                }
            if (j->mirror_out)
                for (b = 0; b < n; b++)
                    for (a = 0; a < m; a++) qk__store(j->mirror_out, j->dt, (j0 + b) * j->ld + i0 + a, kt[a * QK__T + b]);
        }
        QK_PROF_END("gram tile");
        QK_PROF_COUNT("tiles", 1);
        (void)QK__FETCH_ADD(&j->pairs_done, (diag || !j->symmetric) && !j->twice ? m * n : 2 * m * n);
        /* thread 0 after each tile, the others after every 8th (with a warm pool thread 0 may
           run few tiles): about one poll per tile time, as many as one thread would make */
        if (thread == 0 || (++polls & 7) == 0) qk__job_poll(j);
    }
    QK_FREE(accr);
    QK_FREE(cb);
}

/* The tiles of the job (all of K, or one slab) on the engine's threads. */
QK__PRIV void qk__cpu_run_tiles(qk__gram_job *j, int nt)
{
    qk__parallel((int64_t)nt < j->n_tiles ? nt : (int)j->n_tiles, qk__gram_work, j);
}

/* State tiles (plan->bulk_states == 0): the states of R samples at a time (R =
   plan->state_tile), two blocks resident: A holds the block of X rows [i0, i0 + R), B one block
   of columns (X's for K(X,X), Y's for K(X,Y)); K goes block by block. Each pair is computed by
   the same tile arithmetic as with all states resident (the row's state conjugated, the same
   d-chunk order), so K is bitwise the all-resident K. Cost: the column blocks' states are built
   again for every row block (n^2 / 2R state builds for K(X,X)). */
/* qk__cpu_tiles: in qk_internal.h */

/* Row block [i0, i0 + m) of K with state tiles. out: where K[i0][0] goes (leading dimension
   j->ld), or NULL (tile callback); kbase: K itself (the off-diagonal blocks of K(X,X) are
   mirrored into it), or NULL when out is a slab of these rows only (the streamed output's
   writer writes the mirror). */
QK__PRIV qk_result qk__cpu_row_block(const qk__cpu_tiles *t, qk__gram_job *j, int64_t i0, int64_t m, char *out,
                                     char *kbase, int nt)
{
    const qk_gram_desc *desc = t->desc;
    const int sym = desc->y == NULL;
    const int64_t nb = sym ? desc->n_x : desc->n_y;
    const size_t es = j->dt == QK_F32 ? 4 : 8;
    int64_t c0;
    if (qk__cpu_states_into(t->map, desc->x, i0, m, t->path, nt, t->A, j) != 0) return qk__states_failed(j);
    qk__job_poll(j);
    for (c0 = sym ? i0 : 0; c0 < nb && !QK__LOAD(&j->cancel) && !QK__LOAD(&j->oom); c0 += t->R) {
        const int64_t n = nb - c0 < t->R ? nb - c0 : t->R;
        const int diag = sym && c0 == i0;
        if (!diag) {
            if (qk__cpu_states_into(t->map, sym ? desc->x : desc->y, c0, n, t->path, nt, t->B, j) != 0)
                return qk__states_failed(j);
            qk__job_poll(j);
            if (QK__LOAD(&j->cancel)) break;
        }
        j->A = t->A;
        j->B = diag ? t->A : t->B;
        j->na = m;
        j->nb = n;
        j->symmetric = diag;
        j->twice = sym && !diag;
        j->tiles_i = (m + QK__T - 1) / QK__T;
        j->tiles_j = (n + QK__T - 1) / QK__T;
        j->n_tiles = diag ? j->tiles_i * (j->tiles_i + 1) / 2 : j->tiles_i * j->tiles_j;
        j->ti_begin = 0;
        j->ti_end = j->tiles_i;
        j->row_base = 0;
        j->mirror_end = INT64_MAX;
        j->i_base = i0;
        j->j_base = c0;
        j->out = out ? out + (size_t)c0 * es : NULL;
        j->mirror_out = out && kbase && sym && !diag ? kbase + ((size_t)c0 * (size_t)j->ld + (size_t)i0) * es : NULL;
        j->next = 0;
        QK_PROF_BEGIN("gram block");
        qk__cpu_run_tiles(j, nt);
        QK_PROF_END("gram block");
    }
    return QK_OK;
}
/* >>npy_impl ---- .npy / .csv readers and writers ---- */
/* .npy (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte, the header
   length (little-endian uint16 in 1.0, uint32 in 2.0 and 3.0), the header (a Python dict literal,
   ASCII; UTF-8 in 3.0, padded with spaces and ended by '\n'), then the raw array. Only the
   stdio and POSIX (or Win32) calls below are used: fdopen/fileno would need _POSIX_C_SOURCE under
   strict -std=c11, open/write/fsync from <unistd.h> do not. */
/* the stdio and POSIX (or Win32) headers: in qk_internal.h */

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
    char ex[200];
    p = qk__npy_ws(p, e);
    if (p >= e || *p != '{')
        return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no '{'): \"%s\"", path, qk__esc(ex, sizeof ex, h, len, 60));
    p++;
    for (;;) {
        char key[32];
        p = qk__npy_ws(p, e);
        if (p < e && *p == '}') break;
        p = qk__npy_str(p, e, key, sizeof(key));
        if (!p) return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (expected a quoted key): \"%s\"", path, qk__esc(ex, sizeof ex, h, len, 80));
        p = qk__npy_ws(p, e);
        if (p >= e || *p != ':')
            return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no ':' after '%s')", path, qk__esc(ex, sizeof ex, key, strlen(key), 40));
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
            return qk__fail(QK_ERROR_FORMAT, "%s: unexpected key '%s' in .npy header", path, qk__esc(ex, sizeof ex, key, strlen(key), 40));
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

/* One item of the file's dtype at p as a double: kind 'f' (IEEE binary16/32/64), 'i' (signed),
   'u' (unsigned), 'b' (bool, 0 or 1); size in bytes; swap: the file's byte order is not the
   host's. 64-bit integers beyond 2^53 round to the nearest double, as numpy's astype does. */
static double qk__npy_item(const unsigned char *p, char kind, int size, int swap) {
    unsigned char t[8];
    uint64_t u = 0;
    int k;
    for (k = 0; k < size && k < (int)sizeof t; k++) t[k] = p[swap ? size - 1 - k : k];
    if (kind == 'b') return t[0] != 0 ? 1.0 : 0.0;
    if (kind == 'f' && size == 8) { double d; memcpy(&d, t, 8); return d; }
    if (kind == 'f' && size == 4) { float f; memcpy(&f, t, 4); return (double)f; }
    if (kind == 'f') {   /* binary16: sign, 5 exponent bits (bias 15), 10 fraction bits */
        uint16_t h;
        int ex, fr;
        double v;
        memcpy(&h, t, 2);
        ex = (h >> 10) & 0x1f;
        fr = h & 0x3ff;
        if (ex == 0) v = ldexp((double)fr, -24);
        else if (ex == 31) v = fr ? (double)NAN : (double)INFINITY;
        else v = ldexp((double)(fr | 0x400), ex - 25);
        return (h & 0x8000) ? -v : v;
    }
    /* integers: the host-order bytes in t, widened by value */
    if (size == 1) u = t[0];
    else if (size == 2) { uint16_t v; memcpy(&v, t, 2); u = v; }
    else if (size == 4) { uint32_t v; memcpy(&v, t, 4); u = v; }
    else memcpy(&u, t, 8);
    if (kind == 'u') return (double)u;
    if (size == 1) return (double)(int8_t)(uint8_t)u;
    if (size == 2) return (double)(int16_t)(uint16_t)u;
    if (size == 4) return (double)(int32_t)(uint32_t)u;
    return (double)(int64_t)u;
}

/* Converts n items of the file's dtype, already in buf, to doubles in place, from the last to
   the first: item i (at size * i <= 8 * i) is read before the doubles of items >= i are
   written, so no item is overwritten before it is read. */
static void qk__npy_to_double(unsigned char *buf, int64_t n, char kind, int size, int swap) {
    int64_t i;
    for (i = n; i-- > 0;) {
        double d = qk__npy_item(buf + (size_t)size * (size_t)i, kind, size, swap);
        memcpy(buf + 8 * (size_t)i, &d, 8);
    }
}

/* ---- reading files: regular files only ---- */
/* The readers open a path only when it names a regular file: a FIFO would block in open() until
   a writer comes (forever), a device such as /dev/zero never ends, a directory is no data. The
   path is stat()ed first, so that a device is never even opened, then opened without blocking
   and fstat()ed again (the check that counts, free of races). The size from fstat bounds every
   allocation: nothing is allocated for data the file does not hold. */
#ifdef _WIN32
typedef struct _stati64 qk__stat_t;
#define QK__STAT(p, st) _stati64((p), (st))
#define QK__FSTAT(fd, st) _fstati64((fd), (st))
#define QK__OPEN_RD(p) _open((p), _O_RDONLY | _O_BINARY)
#define QK__READ(fd, b, n) _read((fd), (b), (unsigned)(n))
#define QK__RCLOSE(fd) _close(fd)
#define QK__S_ISREG(m) (((m) & _S_IFMT) == _S_IFREG)
#define QK__S_ISDIR(m) (((m) & _S_IFMT) == _S_IFDIR)
#define QK__S_ISFIFO(m) 0
#define QK__S_ISCHR(m) (((m) & _S_IFMT) == _S_IFCHR)
#else
typedef struct stat qk__stat_t;
#define QK__STAT(p, st) stat((p), (st))
#define QK__FSTAT(fd, st) fstat((fd), (st))
#define QK__OPEN_RD(p) open((p), O_RDONLY | O_NONBLOCK | O_NOCTTY)
#define QK__READ(fd, b, n) read((fd), (b), (n))
#define QK__RCLOSE(fd) close(fd)
#define QK__S_ISREG(m) S_ISREG(m)
#define QK__S_ISDIR(m) S_ISDIR(m)
#define QK__S_ISFIFO(m) S_ISFIFO(m)
#define QK__S_ISCHR(m) S_ISCHR(m)
#endif

static qk_result qk__not_regular(const char *path, unsigned mode) {
    const char *what = QK__S_ISDIR(mode) ? "a directory" : QK__S_ISFIFO(mode) ? "a FIFO (named pipe)"
                     : QK__S_ISCHR(mode) ? "a character device" : "not a regular file";
    char ep[QK__ESC_ARG_SIZE];
    return qk__fail(QK_ERROR_IO, "cannot read '%s': it is %s; qk reads regular files only (save the data to a file)",
                    qk__esc_arg(ep, sizeof ep, path), what);
}

/* Opens path for reading when it is a regular file: *fd_out, *size_out (bytes). */
static qk_result qk__open_regular(const char *path, int *fd_out, int64_t *size_out) {
    qk__stat_t st;
    int fd, e;
    char ep[QK__ESC_ARG_SIZE];   /* the path as the message quotes it: escaped, cut */
    if (QK__STAT(path, &st) != 0) {
        e = errno;
        return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", qk__esc_arg(ep, sizeof ep, path), strerror(e));
    }
    if (!QK__S_ISREG(st.st_mode)) return qk__not_regular(path, (unsigned)st.st_mode);
    fd = QK__OPEN_RD(path);
    if (fd < 0) {
        e = errno;
        return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", qk__esc_arg(ep, sizeof ep, path), strerror(e));
    }
    if (QK__FSTAT(fd, &st) != 0) {
        int e = errno;
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_IO, "cannot read '%s': fstat: %s", path, strerror(e));
    }
    if (!QK__S_ISREG(st.st_mode)) { QK__RCLOSE(fd); return qk__not_regular(path, (unsigned)st.st_mode); }
    *fd_out = fd;
    *size_out = (int64_t)st.st_size;
    return QK_OK;
}

/* Reads up to n bytes (fewer only at the end of the file); retries EINTR and short reads.
   Returns the count, or -1 with errno set. */
static int64_t qk__read_full(int fd, void *buf, size_t n) {
    unsigned char *p = (unsigned char *)buf;
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30);
        long k = (long)QK__READ(fd, p + got, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    return (int64_t)got;
}

static const char *qk__shape_str(char *buf, size_t size, const qk__npy_header *h) {
    if (h->ndim == 1) snprintf(buf, size, "(%lld,)", (long long)h->shape[0]);
    else if (h->ndim == 2) snprintf(buf, size, "(%lld, %lld)", (long long)h->shape[0], (long long)h->shape[1]);
    else snprintf(buf, size, "(%d dimensions)", h->ndim);
    return buf;
}

/* Opens path and reads its preamble and header (every .npy reader's first step): *fd_out is left
   at the first data byte, *avail_out holds the bytes after the header, h the parsed header. On
   error nothing is left open. */
static qk_result qk__npy_open(const char *path, int *fd_out, int64_t *avail_out, qk__npy_header *h, int64_t *off_out) {
    unsigned char pre[12];
    char *hdr = NULL;
    int fd = -1;
    size_t hlen, plen;
    int64_t got, fsize = 0;
    qk_result r;
    int major, minor;

    r = qk__open_regular(path, &fd, &fsize);
    if (r != QK_OK) return r;
    got = qk__read_full(fd, pre, 10);
    if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    if (got < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", path);
        goto fail;
    }
    if (got < 10) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
    major = pre[6];
    minor = pre[7];
    plen = 10;
    if (major == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (major == 2 || major == 3) {
        if (qk__read_full(fd, pre + 10, 2) != 2) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
        plen = 12;
    } else {
        r = qk__fail(QK_ERROR_FORMAT, "%s: .npy version %d.%d is not supported (qk reads 1.0, 2.0, 3.0)", path, major, minor);
        goto fail;
    }
    if (hlen == 0 || hlen > QK__NPY_MAX_HEADER) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: implausible .npy header length %lu", path, (unsigned long)hlen);
        goto fail;
    }
    if (fsize < (int64_t)(plen + hlen)) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy header (%lld of %lu bytes)", path,
                     (long long)(fsize > (int64_t)plen ? fsize - (int64_t)plen : 0), (unsigned long)hlen);
        goto fail;
    }
    hdr = (char *)QK_MALLOC(hlen + 1);
    if (!hdr) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for the .npy header", path); goto fail; }
    got = qk__read_full(fd, hdr, hlen);
    if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    if ((size_t)got < hlen) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy header (%lu of %lu bytes)", path, (unsigned long)got, (unsigned long)hlen);
        goto fail;
    }
    hdr[hlen] = 0;
    r = qk__npy_parse_header(path, hdr, hlen, h);
    if (r != QK_OK) goto fail;
    QK_FREE(hdr);
    *fd_out = fd;
    *avail_out = fsize - (int64_t)(plen + hlen);
    if (off_out) *off_out = (int64_t)(plen + hlen);
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (hdr) QK_FREE(hdr);
    return r;
}

/* The data of a .npy read whole: no byte may follow (the file grew while it was read, or holds
   more than its shape). shp, dsc: the header's shape and descr, for the message. */
static qk_result qk__npy_check_end(int fd, const char *path, const char *shp, const char *dsc) {
    unsigned char extra;
    if (qk__read_full(fd, &extra, 1) != 0)
        return qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs", path, shp, dsc);
    return QK_OK;
}

QKDEF qk_result qk_npy_read(const char *path, qk_array *out) {
    unsigned char *data = NULL;
    char shp[64], dsc[48];
    int fd = -1;
    size_t nbytes;
    int64_t got, avail;
    qk__npy_header h;
    qk_result r;
    int size, swap;
    size_t dlen;
    char order, kind;
    int64_t rows, cols, count;

    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_read: path and out must not be NULL");
    r = qk__npy_open(path, &fd, &avail, &h, NULL);
    if (r != QK_OK) return r;

    qk__esc(dsc, sizeof dsc, h.descr, strlen(h.descr), 31);
    order = h.descr[0];
    kind = h.descr[1];
    dlen = strlen(h.descr);
    size = dlen == 3 && h.descr[2] >= '1' && h.descr[2] <= '9' ? h.descr[2] - '0' : 0;
    if (strchr(h.descr, 'O')) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: object arrays (dtype '%s', pickled Python objects) are not supported", path, dsc);
        goto fail;
    }
    if (dlen == 4 && kind == 'f' && (strcmp(h.descr + 2, "16") == 0 || strcmp(h.descr + 2, "12") == 0 || strcmp(h.descr + 2, "10") == 0)) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is long double, whose layout depends on the machine that wrote it "
                     "(x87 80-bit or IEEE 128-bit); save a.astype(np.float64)", path, dsc);
        goto fail;
    }
    /* What numpy writes for a real array: float16/32/64, signed and unsigned integers of 1 to 8
       bytes, bool; any byte order ('|' is numpy's "not applicable", for 1-byte items). */
    if (!strchr("<>=|", order) || order == 0 || size == 0 ||
        !((kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
          ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
          (kind == 'b' && size == 1))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is not supported (qk reads float16/32/64 (f2 f4 f8), "
                     "integers (i1 i2 i4 i8 u1 u2 u4 u8) and bool (b1), either byte order)", path, dsc);
        goto fail;
    }
    if (h.ndim < 1 || h.ndim > 2) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the array has %d dimensions; qk reads 1-D or 2-D arrays", path, h.ndim);
        goto fail;
    }
    qk__shape_str(shp, sizeof shp, &h);
    rows = h.shape[0];
    cols = h.ndim == 2 ? h.shape[1] : 1;
    if (cols > 0 && rows > INT64_MAX / 8 / cols) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s is too large", path, shp);
        goto fail;
    }
    count = rows * cols;
    nbytes = (size_t)((uint64_t)count * (uint64_t)size);
    /* The file size must match the header before anything is allocated for the data: a
       200-byte file that claims 48 GB is refused here, not by malloc (or worse, under
       overcommit, after a 48 GB allocation). */
    if ((uint64_t)avail < (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %llu bytes for shape %s of %s", path,
                     (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size), shp, dsc);
        goto fail;
    }
    if ((uint64_t)avail > (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs (%lld bytes, not %llu)", path,
                     shp, dsc, (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size));
        goto fail;
    }
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
    swap = order == '=' || order == '|' ? 0 : ((order == '<') != qk__host_little());
    if (h.fortran && rows > 1 && cols > 1) {
        /* Fortran order (what np.save writes for an F-contiguous array, e.g. pandas'
           df.to_numpy()): column after column. Read in chunks and transposed into the row-major
           array as they come: the only memory besides the array is one 16 KiB chunk. */
        unsigned char chunk[16384];
        size_t per = sizeof chunk / (size_t)size, done = 0, k;
        got = 0;
        while (done < (size_t)count) {
            size_t want = (size_t)count - done < per ? (size_t)count - done : per;
            int64_t g = qk__read_full(fd, chunk, want * (size_t)size);
            if (g < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
            got += g;
            if ((size_t)g < want * (size_t)size) break;
            for (k = 0; k < want; k++) {
                size_t idx = done + k;   /* column idx / rows, row idx % rows */
                double d = qk__npy_item(chunk + k * (size_t)size, kind, size, swap);
                memcpy(data + 8 * ((idx % (size_t)rows) * (size_t)cols + idx / (size_t)rows), &d, 8);
            }
            done += want;
        }
    } else {
        got = qk__read_full(fd, data, nbytes);
        if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    }
    if ((size_t)got < nbytes) {   /* the file shrank while it was read */
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %lu bytes for shape %s of %s", path,
                     (long long)got, (unsigned long)nbytes, shp, dsc);
        goto fail;
    }
    if ((r = qk__npy_check_end(fd, path, shp, dsc)) != QK_OK) goto fail;
    QK__RCLOSE(fd);
    /* C order; or Fortran order with one row or one column, the same bytes */
    if (!(h.fortran && rows > 1 && cols > 1)) qk__npy_to_double(data, count, kind, size, swap);
    out->data = (double *)(void *)data;
    out->rows = rows;
    out->cols = cols;
    out->ndim = h.ndim;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (data) QK_FREE(data);
    return r;
}

/* ---- states from .npy (qk_npy_read_states) ---- */
/* One item of the file's dtype at p into dst as an element of type `to` (qk_npy_read_states):
   complex items component by component (each swapped on its own), float64 / float32 as they
   are, float16 widened to float32, integers and bool to float64 (as numpy's astype). */
static void qk__npy_state_item(const unsigned char *p, char kind, int size, int swap, qk_state_type to, unsigned char *dst) {
    int k, c, half;
    if (kind == 'c' || (kind == 'f' && size >= 4)) {
        half = kind == 'c' ? size / 2 : size;
        for (c = 0; c < size / half; c++)
            for (k = 0; k < half; k++) dst[c * half + k] = p[c * half + (swap ? half - 1 - k : k)];
    } else if (to == QK_STATE_F32) {
        float f = (float)qk__npy_item(p, kind, size, swap);   /* float16: exact in float32 */
        memcpy(dst, &f, 4);
    } else {
        double d = qk__npy_item(p, kind, size, swap);
        memcpy(dst, &d, 8);
    }
}

/* A .npy of states opened and its header checked (qk__npy_states_open): what qk_npy_read_states
   reads, and what a reader of single rows needs (qk-gram-mpi's state provider reads the rows a
   rank asks for at data_off + row * row_items * size). */
typedef struct qk__npy_states {
    qk_state_type type;     /* the type the items are read as */
    int64_t n, dim;         /* n states of dim amplitudes (mixed: n dim x dim matrices) */
    int64_t count;          /* items in the file: n dim, or n dim^2 */
    int64_t row_items;      /* items of one state: dim, or dim^2 */
    int64_t data_off;       /* the first data byte */
    int mixed;              /* 3-D: density matrices */
    int size, swap;         /* an item's bytes in the file; its byte order is not the host's */
    int transposed;         /* Fortran order with more than one axis longer than 1: no row is contiguous */
    int direct;             /* the file's bytes are the elements (no conversion, not transposed) */
    char kind;              /* 'c', 'f', 'i', 'u', 'b' */
    char dsc[48], shp[96];  /* the dtype and shape as messages quote them */
} qk__npy_states;

/* Opens path and checks its header for states (dtype, shape, and a file size that matches the
   shape exactly), as qk_npy_read_states does; *fd_out is left at the first data byte. On error
   nothing is left open. */
static qk_result qk__npy_states_open(const char *path, int *fd_out, qk__npy_states *f) {
    int fd = -1, size = 0, i, longer;
    int64_t avail, n, dim, count;
    qk__npy_header h;
    qk_result r;
    char order, kind;
    const char *digits;

    memset(f, 0, sizeof *f);
    r = qk__npy_open(path, &fd, &avail, &h, &f->data_off);
    if (r != QK_OK) return r;
    qk__esc(f->dsc, sizeof f->dsc, h.descr, strlen(h.descr), 31);
    order = h.descr[0];
    kind = h.descr[1];
    for (digits = h.descr + 2; *digits >= '0' && *digits <= '9' && size < 100; digits++) size = size * 10 + (*digits - '0');
    if (strchr(h.descr, 'O')) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: object arrays (dtype '%s', pickled Python objects) are not supported", path, f->dsc);
        goto fail;
    }
    if ((kind == 'c' && size == 32) || (kind == 'f' && (size == 16 || size == 12 || size == 10)) || (kind == 'c' && (size == 24 || size == 20))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is long double, whose layout depends on the machine that wrote it; "
                     "save S.astype(np.complex128)", path, f->dsc);
        goto fail;
    }
    /* complex128 / complex64 / float64 / float32 kept as they are; float16 read as float32,
       integers and bool as float64; either byte order */
    if (!order || !strchr("<>=|", order) || h.descr[1] == 0 || *digits != 0 ||
        !((kind == 'c' && (size == 16 || size == 8)) || (kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
          ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) || (kind == 'b' && size == 1))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is not supported for states (qk reads complex128, complex64, float64 and "
                     "float32 (c16 c8 f8 f4), and float16, integers and bool as real amplitudes, either byte order)", path, f->dsc);
        goto fail;
    }
    f->type = kind == 'c' ? (size == 16 ? QK_STATE_C128 : QK_STATE_C64) : kind == 'f' && size <= 4 ? QK_STATE_F32 : QK_STATE_F64;
    if (h.ndim == 2) snprintf(f->shp, sizeof f->shp, "(%lld, %lld)", (long long)h.shape[0], (long long)h.shape[1]);
    else if (h.ndim == 3) snprintf(f->shp, sizeof f->shp, "(%lld, %lld, %lld)", (long long)h.shape[0], (long long)h.shape[1], (long long)h.shape[2]);
    else if (h.ndim == 1) snprintf(f->shp, sizeof f->shp, "(%lld,)", (long long)h.shape[0]);
    else snprintf(f->shp, sizeof f->shp, "(%d dimensions)", h.ndim);
    if (h.ndim != 2 && h.ndim != 3) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s: states are 2-D (n_states, dim) or, density matrices, 3-D (n, dim, dim)%s",
                     path, f->shp, h.ndim == 1 ? " (for one state, save s.reshape(1, -1))" : "");
        goto fail;
    }
    n = h.shape[0];
    dim = h.shape[1];
    if (h.ndim == 3 && h.shape[2] != dim) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s: density matrices must be square (n, dim, dim)", path, f->shp);
        goto fail;
    }
    /* n * dim (* dim) items, and their bytes as read and as stored, without overflow */
    count = 0;
    if (dim > 0 && n > 0) {
        if ((h.ndim == 3 && (dim > INT64_MAX / 16 / dim || n > INT64_MAX / 16 / (dim * dim))) || (h.ndim == 2 && n > INT64_MAX / 16 / dim)) {
            r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s is too large", path, f->shp);
            goto fail;
        }
        count = h.ndim == 3 ? n * dim * dim : n * dim;
    }
    /* The file size must match the header before anything is allocated (a 200-byte file that
       claims 48 GB is "truncated", not an allocation). */
    if ((uint64_t)avail < (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %llu bytes for shape %s of %s", path, (long long)avail,
                     (unsigned long long)((uint64_t)count * (uint64_t)size), f->shp, f->dsc);
        goto fail;
    }
    if ((uint64_t)avail > (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs (%lld bytes, not %llu)", path,
                     f->shp, f->dsc, (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size));
        goto fail;
    }
    f->n = n;
    f->dim = dim;
    f->count = count;
    f->row_items = h.ndim == 3 ? dim * dim : dim;
    f->mixed = h.ndim == 3;
    f->size = size;
    f->kind = kind;
    f->swap = order == '=' || order == '|' ? 0 : ((order == '<') != qk__host_little());
    /* Fortran order is a transpose unless at most one axis is longer than 1 */
    for (i = 0, longer = 0; i < h.ndim; i++) longer += h.shape[i] > 1;
    f->transposed = h.fortran && longer > 1;
    f->direct = !f->transposed && !f->swap && size == qk__state_esize(f->type) && (kind == 'c' || kind == 'f');
    *fd_out = fd;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    return r;
}

QKDEF qk_result qk_npy_read_states(const char *path, qk_states_array *out) {
    unsigned char *data = NULL;
    int fd = -1, esize;
    int64_t got = 0, nbytes;
    qk__npy_states f;
    qk_result r;

    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_read_states: path and out must not be NULL");
    r = qk__npy_states_open(path, &fd, &f);
    if (r != QK_OK) return r;
    esize = qk__state_esize(f.type);
    nbytes = f.count * esize;
    if ((uint64_t)nbytes >= (uint64_t)SIZE_MAX) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", path, (long long)f.count);
        goto fail;
    }
    data = (unsigned char *)QK_MALLOC((size_t)(nbytes > 0 ? nbytes : 8));
    if (!data) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld elements of %s (%.3g GB)", path, (long long)f.count,
                     f.dsc, (double)nbytes * 1e-9);
        goto fail;
    }
    if (f.direct) {   /* the file's bytes are the elements */
        got = qk__read_full(fd, data, (size_t)nbytes);
        if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    } else {
        /* in 16 KiB chunks, each item converted (byte order, type) to its row-major place */
        unsigned char chunk[16384];
        const int size = f.size;
        const int64_t per = (int64_t)(sizeof chunk / (size_t)size);
        const int64_t s0 = f.n, s1 = f.dim, s2 = f.mixed ? f.dim : 1;
        int64_t done = 0, k;
        while (done < f.count) {
            const int64_t want = f.count - done < per ? f.count - done : per;
            const int64_t g = qk__read_full(fd, chunk, (size_t)(want * size));
            if (g < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
            got += g / size * esize;
            if (g < want * size) break;
            for (k = 0; k < want; k++) {
                int64_t idx = done + k, c;
                if (f.transposed) {   /* idx = i0 + s0 (i1 + s1 i2) */
                    const int64_t i0 = idx % s0, rest = idx / s0;
                    c = (i0 * s1 + rest % s1) * s2 + rest / s1;
                } else c = idx;
                qk__npy_state_item(chunk + k * size, f.kind, size, f.swap, f.type, data + (size_t)c * (size_t)esize);
            }
            done += want;
        }
    }
    if (got < nbytes) {   /* the file shrank while it was read */
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: the file shrank while it was read (shape %s of %s)", path, f.shp, f.dsc);
        goto fail;
    }
    if ((r = qk__npy_check_end(fd, path, f.shp, f.dsc)) != QK_OK) goto fail;
    QK__RCLOSE(fd);
    out->data = data;
    out->type = f.type;
    out->n = f.n;
    out->dim = f.dim;
    out->mixed = f.mixed;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (data) QK_FREE(data);
    return r;
}

QKDEF void qk_states_array_free(qk_states_array *a) {
    if (!a) return;
    if (a->data) QK_FREE(a->data);
    memset(a, 0, sizeof *a);
}

/* QK__OPEN_TMP, QK__WRITE, QK__FSYNC, QK__CLOSE, QK__GETPID, QK__RENAME: in qk_internal.h */

/* Writes all n bytes; retries short writes and EINTR. */
QK__PRIV int qk__write_all(int fd, const void *buf, size_t n) {
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

/* Temporary names: path.tmp.<pid>.<k>.<host>, host this machine's node name (uname) with every
   character other than a letter, digit or '-' made '_', at most 40 of them ("" where unknown).
   The pid and the host let a later run tell a dead process's temporary from a live one's. */
#define QK__HOST_TAG 41
static void qk__host_tag(char *tag)
{
#ifndef _WIN32
    struct utsname u;
    size_t i;
    tag[0] = 0;
    if (uname(&u) != 0) return;
    for (i = 0; i + 1 < QK__HOST_TAG && u.nodename[i]; i++) {
        char c = u.nodename[i];
        tag[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    tag[i] = 0;
#else
    tag[0] = 0;
#endif
}

/* Removes the temporaries of path that dead processes of this host left (a killed qk-gram, a
   SIGKILLed MPI rank): names path.tmp.<pid>.<k>.<host> in path's directory with this host's tag,
   a pid other than ours that is not running, owned by this user. Best effort and Linux only (a
   process is running while /proc/<pid> exists; without /proc nothing is removed). Never a live
   process's temporary; one of another host, or of an older qk without the host in the name, is
   left alone. */
static void qk__sweep_tmp(const char *path)
{
#if defined(__linux__)
    char host[QK__HOST_TAG], dir[4096], full[4096 + 256], proc[64];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t blen = strlen(base), dl = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    struct stat st;
    struct dirent *e;
    DIR *d;
    qk__host_tag(host);
    if (!host[0] || blen == 0 || dl >= sizeof dir || stat("/proc/self", &st) != 0) return;
    if (slash) memcpy(dir, path, dl);
    else dir[0] = '.';
    dir[dl] = 0;
    d = opendir(dir);
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name, *q;
        long pid = 0;
        int digits = 0;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0) continue;
        for (q = n + blen + 5; *q >= '0' && *q <= '9' && digits < 10; q++, digits++) pid = pid * 10 + (*q - '0');
        if (digits == 0 || *q != '.' || pid <= 0 || pid == QK__GETPID()) continue;
        for (q++, digits = 0; *q >= '0' && *q <= '9'; q++) digits++;
        if (digits == 0 || *q != '.' || strcmp(q + 1, host) != 0) continue;
        snprintf(proc, sizeof proc, "/proc/%ld", pid);
        if (stat(proc, &st) == 0 || errno != ENOENT) continue;   /* running, or unknown */
        if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, n) >= sizeof full) continue;
        if (stat(full, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
        (void)unlink(full);
    }
    closedir(d);
#else
    QK__UNUSED(path);
#endif
}

/* Creates a temporary file next to path (same directory, so that rename stays within one file
   system): *tmp_out gets its name (QK_MALLOC'ed), *fd_out its descriptor. O_EXCL makes the name
   ours even when another thread or process writes the same path: a taken name is skipped, never
   shared. Stale temporaries of path (qk__sweep_tmp) are removed first. */
QK__PRIV qk_result qk__open_tmp(const char *path, char **tmp_out, int *fd_out) {
    size_t plen = strlen(path);
    char *tmp = (char *)QK_MALLOC(plen + 48 + QK__HOST_TAG);
    char host[QK__HOST_TAG];
    int fd = -1, i;
    *tmp_out = NULL;
    *fd_out = -1;
    if (!tmp) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "cannot write '%s': out of memory", path);
    qk__sweep_tmp(path);
    qk__host_tag(host);
    for (i = 0; i < 1000; i++) {
        snprintf(tmp, plen + 48 + QK__HOST_TAG, "%s.tmp.%ld.%d%s%s", path, QK__GETPID(), i, host[0] ? "." : "", host);
        fd = QK__OPEN_TMP(tmp);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': creating '%s' failed: %s", path, tmp, strerror(errno));
        QK_FREE(tmp);
        return r;
    }
    *tmp_out = tmp;
    *fd_out = fd;
    return QK_OK;
}

/* After a rename: the new name is durable once the directory entry is on disk. Best effort
   (some file systems refuse fsync on a directory). */
QK__PRIV void qk__sync_dir(const char *path) {
#ifndef _WIN32
    const char *slash = strrchr(path, '/');
    char dir[4096];
    int dfd;
    if (slash) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        if (dl >= sizeof dir) return;
        memcpy(dir, path, dl);
        dir[dl] = 0;
        dfd = open(dir, O_RDONLY);
    } else {
        dfd = open(".", O_RDONLY);
    }
    if (dfd >= 0) { (void)fsync(dfd); (void)close(dfd); }
#else
    QK__UNUSED(path);
#endif
}

/* The commit protocol's last steps, in one place for every writer of a temporary file from
   qk__open_tmp (the atomic writer below, the streamed .npy of K, qk_gram_mpi's MPI-IO file): the
   caller has written, synced (unless asked not to) and closed it; qk__tmp_commit renames it over
   path and syncs the directory (unless no_sync); on failure the temporary is removed and path is
   left as it was. qk__tmp_discard removes a temporary (after a failure or a cancel), truncating it
   first so that pages under writeback are dropped rather than waited for. */
QK__PRIV qk_result qk__tmp_commit(const char *tmp, const char *path, int no_sync) {
    if (QK__RENAME(tmp, path) != 0) {
        const int e = errno;
        (void)remove(tmp);
        return qk__fail(QK_ERROR_IO, "cannot write '%s': rename failed: %s", path, strerror(e));
    }
    if (!no_sync) qk__sync_dir(path);
    return QK_OK;
}

QK__PRIV void qk__tmp_discard(const char *tmp) {
    int t;
    if (!tmp) return;
    t = open(tmp, O_WRONLY | O_TRUNC);
    if (t >= 0) (void)QK__CLOSE(t);
    (void)remove(tmp);
}

/* Writes a then b to path atomically: a temporary file in the same directory, fsync, rename
   over path. On any error the temporary file is removed and path is left as it was. Also for
   other writers of this header (cache files). */
QK__PRIV qk_result qk__write_file_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    char *tmp;
    int fd, err;
    const char *what;
    qk_result r0;

    if (!path) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "write: path is NULL");
    r0 = qk__open_tmp(path, &tmp, &fd);
    if (r0 != QK_OK) return r0;
    what = "write";
    if (qk__write_all(fd, a, na) != 0 || (nb > 0 && qk__write_all(fd, b, nb) != 0)) goto fail;
    what = "fsync";
    if (QK__FSYNC(fd) != 0) goto fail;
    what = "close";
    err = QK__CLOSE(fd);
    fd = -1;
    if (err != 0) goto fail;
    r0 = qk__tmp_commit(tmp, path, 0);
    QK_FREE(tmp);
    return r0;
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

/* The .npy header of a C-order float32/float64 array (cols == 0: 1-D) into hdr; returns its
   length, a multiple of 64 (numpy pads with spaces and a final '\n' so that the data starts on
   a 64-byte boundary: memory-mapped readers rely on the alignment). */
QK__PRIV size_t qk__npy_make_header(char hdr[192], qk_dtype dtype, int64_t rows, int64_t cols) {
    int itemsize = dtype == QK_F32 ? 4 : 8, len;
    size_t total;
    /* Native byte order: the data is written as it lies in memory. */
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    if (cols > 0)
        len = snprintf(hdr + 10, 192 - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld, %lld), }",
                       qk__host_little() ? '<' : '>', itemsize, (long long)rows, (long long)cols);
    else
        len = snprintf(hdr + 10, 192 - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld,), }",
                       qk__host_little() ? '<' : '>', itemsize, (long long)rows);
    total = ((size_t)(10 + len + 1) + 63) / 64 * 64;
    memset(hdr + 10 + len, ' ', total - (size_t)(10 + len) - 1);
    hdr[total - 1] = '\n';
    hdr[8] = (char)((total - 10) & 0xff);
    hdr[9] = (char)((total - 10) >> 8);
    return total;
}

/* Checks a 2-D (cols > 0) or 1-D (cols == 0) shape of float32/float64 and returns its bytes. */
QK__PRIV qk_result qk__npy_shape_bytes(const char *who, qk_dtype dtype, int64_t rows, int64_t cols, size_t *nbytes) {
    size_t itemsize;
    int64_t count;
    if (dtype != QK_F32 && dtype != QK_F64)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: dtype %d is neither QK_F32 nor QK_F64", who, (int)dtype);
    if (rows < 0 || cols < 0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: negative shape (%lld, %lld)", who, (long long)rows, (long long)cols);
    itemsize = dtype == QK_F32 ? 4 : 8;
    if (cols > 0 && rows > INT64_MAX / 8 / cols)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: shape (%lld, %lld) is too large", who, (long long)rows, (long long)cols);
    count = cols > 0 ? rows * cols : rows;
    if ((uint64_t)count > (uint64_t)(SIZE_MAX / itemsize))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: %lld elements do not fit in memory", who, (long long)count);
    *nbytes = (size_t)count * itemsize;
    return QK_OK;
}

QKDEF qk_result qk_npy_write(const char *path, const void *data, qk_dtype dtype, int64_t rows,
                             int64_t cols) {
    char hdr[192];
    size_t nbytes = 0, total;
    qk_result r;

    if (!path) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: path is NULL");
    if (dtype == QK_DTYPE_DEFAULT) dtype = QK_F64;
    r = qk__npy_shape_bytes("qk_npy_write", dtype, rows, cols, &nbytes);
    if (r != QK_OK) return r;
    if (!data && nbytes > 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: data is NULL");
    total = qk__npy_make_header(hdr, dtype, rows, cols);
    return qk__write_file_atomic(path, hdr, total, data, nbytes);
}

#ifndef QK_NO_CSV   /* the CSV reader (compiled out by QK_NO_CSV: qk_csv_read says so) */
/* Reads a whole regular file (at most max bytes) into a NUL-terminated buffer. */
static qk_result qk__read_file(const char *path, int64_t max, const char *macro, char **out, size_t *out_len) {
    int fd;
    int64_t size, got;
    char *buf;
    unsigned char extra;
    qk_result r = qk__open_regular(path, &fd, &size);
    if (r != QK_OK) return r;
    if (size > max) {
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_FORMAT, "%s: %lld bytes, more than %s (%lld) allows", path, (long long)size, macro, (long long)max);
    }
    if ((uint64_t)size >= (uint64_t)SIZE_MAX) { QK__RCLOSE(fd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: too large for memory", path); }
    buf = (char *)QK_MALLOC((size_t)size + 1);
    if (!buf) {
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for its %lld bytes", path, (long long)size);
    }
    got = qk__read_full(fd, buf, (size_t)size);
    if (got >= 0 && qk__read_full(fd, &extra, 1) != 0) {
        QK__RCLOSE(fd);
        QK_FREE(buf);
        return qk__fail(QK_ERROR_IO, "%s: the file grew while it was read", path);
    }
    if (got < 0) {
        int e = errno;
        QK__RCLOSE(fd);
        QK_FREE(buf);
        return qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(e));
    }
    QK__RCLOSE(fd);
    buf[got] = 0;
    *out = buf;
    *out_len = (size_t)got;
    return QK_OK;
}

/* ---- CSV ---- */
/* The rules (docs/cli.md "Input .csv"): comma-separated numbers in C syntax ('.' decimals,
   optional exponent, inf / nan), any locale, any length, in double quotes or not ("0.1" is
   0.1); blanks around fields; blank lines and '#' comment lines skipped; '\n' or '\r\n' line
   ends; a UTF-8 byte order mark. The first other line is a header only when it reads as names:
   every non-empty field a name (qk__csv_name: it starts with a letter or '_' and is not NA,
   nan, inf and the like), at least one; otherwise it is data like any line (so NA or a U+2212
   minus there is an error naming line and column, never a dropped row). A header must name
   every column (an empty first name is how pandas' to_csv marks its index column: refused with
   that advice, since the index would be read as a feature) and as many columns as the data has. Any other byte below 0x20 (NUL included) or 0x7f is an error
   naming its line: a CSV file is text. A data field that is not a number is an error naming
   line and column, with a hint when the line holds ';' or tabs (another separator). */

/* A field with blanks (space, tab) trimmed. */
static void qk__csv_trim(const char **s, const char **e) {
    while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

/* A field in double quotes ("0.1", "x") without them: every field is read the same quoted or not. */
static void qk__csv_unquote(const char **s, const char **e) {
    if (*e - *s >= 2 && **s == '"' && (*e)[-1] == '"') {
        (*s)++;
        (*e)--;
        qk__csv_trim(s, e);
    }
}

/* A missing-value marker (NA, N/A, null, none) or a special number word (nan, inf): never a name. */
static int qk__csv_na_like(const char *s, size_t n) {
    static const char *const w[] = {"na", "n/a", "nan", "inf", "infinity", "null", "none", "nil"};
    size_t k;
    for (k = 0; k < sizeof w / sizeof w[0]; k++)
        if (qk__ci_eq(s, n, w[k])) return 1;
    return 0;
}

/* Holds U+2212 MINUS SIGN (what word processors and some exports write for '-'). */
static int qk__csv_u2212(const char *s, const char *e) {
    for (; e - s >= 3; s++)
        if (!memcmp(s, "\xe2\x88\x92", 3)) return 1;
    return 0;
}

/* Reads as a column name (a trimmed, unquoted, non-empty field): it starts with an ASCII letter,
   '_' or a non-ASCII letter, and is not NA, nan, inf and the like. A non-ASCII character counts
   as a letter unless it is in a block of signs, punctuation, digits or symbols (U+2212 MINUS
   SIGN, the dashes, fullwidth digits and minus, x and division signs, superscripts). */
static int qk__csv_name(const char *s, const char *e) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t cp;
    if (qk__csv_na_like(s, (size_t)(e - s))) return 0;
    if ((u[0] >= 'a' && u[0] <= 'z') || (u[0] >= 'A' && u[0] <= 'Z') || u[0] == '_') return 1;   /* any locale */
    if (u[0] >= 0xC2 && u[0] <= 0xDF && e - s >= 2 && (u[1] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    else if (u[0] >= 0xE0 && u[0] <= 0xEF && e - s >= 3 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    else if (u[0] >= 0xF0 && u[0] <= 0xF4 && e - s >= 4 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80 &&
             (u[3] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
             (u[3] & 0x3F);
    else
        return 0;   /* an ASCII sign, digit or punctuation, or not UTF-8 */
    if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return 0;                 /* Latin-1 signs and symbols */
    if (cp >= 0x300 && cp <= 0x36F) return 0;                            /* combining marks */
    if (cp >= 0x2000 && cp <= 0x2BFF) return 0;                          /* punctuation, dashes, minus, math */
    if (cp >= 0x3000 && cp <= 0x303F) return 0;                          /* CJK punctuation */
    if ((cp >= 0xFE50 && cp <= 0xFE6F) || (cp >= 0xFF00 && cp <= 0xFF20) || /* small and fullwidth forms */
        (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65) || cp >= 0xFFF0) return 0;
    return 1;
}

typedef struct qk__csv_scan_state {
    const char *path;
    qk__radix rx;
    double *data;           /* NULL: count only */
    int64_t rows, cols, cols_line, header_cols, header_line, k;
} qk__csv_scan_state;

/* One data line: every field a number. */
static qk_result qk__csv_line(qk__csv_scan_state *c, const char *s, const char *e, int64_t line, int first) {
    const char *f = s;
    int64_t col = 0;
    char ex[200];
    for (;;) {
        const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b, *qa, *qb;
        size_t n;
        double v;
        if (!fe) fe = e;
        b = fe;
        col++;
        qk__csv_trim(&a, &b);
        qa = a;
        qb = b;
        qk__csv_unquote(&a, &b);   /* "0.1" is 0.1 */
        if (a == b)
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: empty field", c->path, (long long)line, (long long)col);
        n = qk__num_len(a, (size_t)(b - a), 1);
        if (n != (size_t)(b - a)) {
            const char *hint = "";
            if (qk__csv_na_like(a, (size_t)(b - a)))
                hint = " (a missing value: qk needs every value of every sample)";
            else if (qk__csv_u2212(a, b))
                hint = " (\\xe2\\x88\\x92 is U+2212 MINUS SIGN: write the ASCII '-')";
            else if (memchr(s, ';', (size_t)(e - s)))
                hint = " (the line holds ';': qk reads comma-separated values with '.' as the decimal point; "
                       "semicolon-separated files are not supported)";
            else if (memchr(a, '\t', (size_t)(b - a)))
                hint = " (the field holds a tab: qk reads comma-separated values, not tab-separated ones)";
            else if (memchr(a, ' ', (size_t)(b - a)))
                hint = " (the field holds a space: qk reads comma-separated values)";
            else if (first)
                hint = " (the first line is a header only when every field is a name: it starts with a letter or '_' "
                       "and is not NA, nan or inf)";
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: '%s' is not a number%s", c->path, (long long)line,
                            (long long)col, qk__esc(ex, sizeof ex, qa, (size_t)(qb - qa), 40), hint);
        }
        if (!qk__strtod_c(a, n, &c->rx, &v))
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: line %lld: out of memory reading a %lu-byte number", c->path,
                            (long long)line, (unsigned long)n);
        if (isinf(v) && !isalpha((unsigned char)a[a[0] == '+' || a[0] == '-']))
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: '%s' is out of range for a double", c->path,
                            (long long)line, (long long)col, qk__esc(ex, sizeof ex, qa, (size_t)(qb - qa), 40));
        /* The counting pass has checked every row's length, so the fill pass fits. */
        if (c->data) c->data[c->k++] = v;
        if (fe == e) break;
        f = fe + 1;
    }
    if (c->cols < 0 && c->header_cols >= 0 && col != c->header_cols)
        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld has %lld columns, the header (line %lld) names %lld", c->path,
                        (long long)line, (long long)col, (long long)c->header_line, (long long)c->header_cols);
    if (c->cols < 0) { c->cols = col; c->cols_line = line; }
    else if (col != c->cols)
        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld has %lld columns, line %lld has %lld", c->path,
                        (long long)line, (long long)col, (long long)c->cols_line, (long long)c->cols);
    c->rows++;
    return QK_OK;
}

/* Walks the text once; counts rows and columns when data is NULL, fills data otherwise. */
static qk_result qk__csv_scan(const char *path, const char *text, size_t len, double *data,
                              int64_t *rows_out, int64_t *cols_out) {
    const char *p = text, *end = text + len;
    int64_t line = 0;
    int first = 1;
    qk__csv_scan_state c;
    qk_result r;
    memset(&c, 0, sizeof c);
    c.path = path;
    c.data = data;
    c.cols = c.header_cols = -1;
    qk__radix_init(&c.rx);
    if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) p += 3;   /* UTF-8 byte order mark */
    while (p < end) {
        const char *s = p, *e = (const char *)memchr(p, '\n', (size_t)(end - p)), *q;
        if (!e) e = end;
        p = e + 1;
        line++;
        if ((int64_t)(e - s) > (int64_t)QK_CSV_MAX_LINE)
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld is longer than QK_CSV_MAX_LINE (%lld bytes): not a CSV file of samples?",
                            path, (long long)line, (long long)QK_CSV_MAX_LINE);
        for (q = s; q < e; q++) {
            unsigned char ch = (unsigned char)*q;
            if ((ch < 0x20 && ch != '\t' && !(ch == '\r' && q == e - 1)) || ch == 0x7f)
                return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, byte %lld (file offset %lld): control byte %s; a CSV file is "
                                "text (a binary file?%s)", path, (long long)line, (long long)(q - s + 1), (long long)(q - text),
                                ch == 0 ? "\\0" : ch == '\r' ? "\\r" : ch == 0x7f ? "\\x7f" : ch == 0x0c ? "\\f" : "below 0x20",
                                ch == '\r' ? " or old Mac line ends: qk reads \\n or \\r\\n" : "");
        }
        if (e > s && e[-1] == '\r') e--;
        for (q = s; q < e && (*q == ' ' || *q == '\t'); q++) {}
        if (q == e || *q == '#') continue;   /* blank or comment line */
        if (first) {
            const char *f = s;
            int numeric = 0, names = 0;
            int64_t col = 0;
            first = 0;
            /* A header only when it reads as names: every field a name (or empty: the header check
               below then says which column has none), at least one a name. Anything else (a
               number, NA, a U+2212 minus) makes it a data line, read or refused, never dropped. */
            for (;;) {
                const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b;
                if (!fe) fe = e;
                b = fe;
                qk__csv_trim(&a, &b);
                qk__csv_unquote(&a, &b);
                if (a != b) {
                    if (!qk__csv_name(a, b)) { numeric = 1; break; }
                    names++;
                }
                if (fe == e) break;
                f = fe + 1;
            }
            if (!numeric && names) {   /* the header: every column named */
                f = s;
                for (;;) {
                    const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b;
                    if (!fe) fe = e;
                    b = fe;
                    col++;
                    qk__csv_trim(&a, &b);
                    qk__csv_unquote(&a, &b);
                    if (a == b)
                        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld (the header), column %lld has no name%s", path,
                                        (long long)line, (long long)col,
                                        col == 1 && fe != e ? ": an unnamed first column is how pandas' to_csv writes its index "
                                        "(and R's write.csv its row names); save with to_csv(path, index=False) "
                                        "(write.csv(x, row.names = FALSE)) (the index would be read as a feature)" : "");
                    if (fe == e) break;
                    f = fe + 1;
                }
                c.header_cols = col;
                c.header_line = line;
                continue;
            }
            r = qk__csv_line(&c, s, e, line, 1);
        } else {
            r = qk__csv_line(&c, s, e, line, 0);
        }
        if (r != QK_OK) return r;
    }
    if (c.rows == 0) return qk__fail(QK_ERROR_FORMAT, "%s: no numeric rows", path);
    *rows_out = c.rows;
    *cols_out = c.cols;
    return QK_OK;
}

QKDEF qk_result qk_csv_read(const char *path, qk_array *out) {
    char *text = NULL;
    size_t len = 0;
    int64_t rows = 0, cols = 0;
    double *data;
    qk_result r;
    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_csv_read: path and out must not be NULL");
    r = qk__read_file(path, (int64_t)QK_CSV_MAX_BYTES, "QK_CSV_MAX_BYTES", &text, &len);
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
#else
QKDEF qk_result qk_csv_read(const char *path, qk_array *out) {
    (void)path; (void)out;
    return qk__fail(QK_ERROR_UNSUPPORTED, "qk_csv_read: the CSV reader is compiled out (QK_NO_CSV)");
}
#endif /* QK_NO_CSV */

QKDEF void qk_array_free(qk_array *a) {
    if (!a) return;
    if (a->data) QK_FREE(a->data);
    a->data = NULL;
    a->rows = a->cols = 0;
    a->ndim = 0;
}
/* ---- end npy / csv ---- */

/* >>npy_stream ---- the streaming .npy writer ---- */
/* K goes into its .npy file while it is computed (QK_OUTPUT_NPY): the file is created as a
   temporary next to the target (qk__open_tmp), rows and row segments are written at their
   offsets as the engines deliver them, and qk__npyw_commit syncs and renames. A syncer thread
   runs fsync whenever QK__NPYW_SYNC_BYTES more have been written, so that the disk writes back
   while the engines compute (the kernel's own writeback starts only at dirty_background_ratio,
   10% of RAM: on a 128 GB machine a 6 GB K would otherwise be written back only by the final
   sync, after the compute). qk__npyw_abort removes the temporary file; the target is never
   touched before the rename. The writer waits while more than QK__NPYW_MAX_DIRTY bytes are
   written but not yet synced: the page cache then never holds more than that of K, a sync in
   flight is short (a cancel stops within a fraction of a second: the abort truncates the file,
   which waits for pages under writeback), and the final sync has little left. One thread
   writes (lseek + write: POSIX.1, declared under strict -std=c99 too). */
#define QK__NPYW_SYNC_BYTES ((uint64_t)16 << 20)
#define QK__NPYW_MAX_DIRTY ((uint64_t)64 << 20)

/* qk__npyw: in qk_internal.h (the engines stream into it) */

static void *qk__npyw_syncer(void *p)
{
    qk__npyw *w = (qk__npyw *)p;
    qk__mutex_lock(&w->mu);
    for (;;) {
        uint64_t upto;
        while (!w->stop && w->dirty < QK__NPYW_SYNC_BYTES) qk__cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        w->dirty = 0;
        upto = w->written_mt;
        qk__mutex_unlock(&w->mu);
        if (QK__FSYNC(w->fd) != 0 && !w->sync_errno) w->sync_errno = errno;
        qk__mutex_lock(&w->mu);
        w->synced = upto;
        qk__cond_broadcast(&w->cv);
    }
    qk__mutex_unlock(&w->mu);
    return NULL;
}

static void qk__npyw_stop_syncer(qk__npyw *w)
{
    if (!w->syncer_on) return;
    qk__mutex_lock(&w->mu);
    w->stop = 1;
    qk__cond_signal(&w->cv);
    qk__mutex_unlock(&w->mu);
    qk__thread_join(w->syncer);
    qk__cond_destroy(&w->cv);
    qk__mutex_destroy(&w->mu);
    w->syncer_on = 0;
}

/* Removes the temporary file; the target stays as it was. Safe on a zeroed or failed writer.
   The file is first truncated (its dirty pages dropped), so that a sync in flight, and the
   abort, take milliseconds rather than the time to write back what was written. */
QK__PRIV void qk__npyw_abort(qk__npyw *w)
{
    if (w->tmp) {
        int t = open(w->tmp, O_WRONLY | O_TRUNC);
        if (t >= 0) (void)QK__CLOSE(t);
    }
    qk__npyw_stop_syncer(w);
    if (w->fd >= 0) (void)QK__CLOSE(w->fd);
    w->fd = -1;
    if (w->tmp) { qk__tmp_discard(w->tmp); QK_FREE(w->tmp); w->tmp = NULL; }
}

/* syncer: 1 runs the syncer thread (sequential writes: the GPU engine's row slabs); 0 syncs at
   commit only (the CPU engine's symmetric mirror is scattered strips: written back while the
   job runs they would be random I/O in flight, which a cancel must wait for). */
QK__PRIV qk_result qk__npyw_open(qk__npyw *w, const char *path, qk_dtype dt, int64_t rows, int64_t cols, int no_sync,
                                 int syncer)
{
    char hdr[192];
    size_t nbytes = 0;
    qk_result r;
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (!path || !path[0]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output NPY needs out_path");
#ifdef _WIN32
    return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram: output NPY is POSIX only in this version");
#else
    r = qk__npy_shape_bytes("qk_gram", dt, rows, cols, &nbytes);
    if (r != QK_OK) return r;
    if (sizeof(off_t) < 8 && nbytes > ((size_t)1 << 30))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram: K of %.3g GB needs 64-bit file offsets (build with -D_FILE_OFFSET_BITS=64)", (double)nbytes * 1e-9);
    w->path = path;
    w->es = dt == QK_F32 ? 4 : 8;
    w->rows = rows;
    w->cols = cols;
    w->no_sync = no_sync;
    w->hdr = qk__npy_make_header(hdr, dt, rows, cols);
    QK__UNUSED(syncer);
    r = qk__open_tmp(path, &w->tmp, &w->fd);
    if (r != QK_OK) return r;
    if (qk__write_all(w->fd, hdr, w->hdr) != 0) {
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s", path, strerror(errno));
        qk__npyw_abort(w);
        return r;
    }
    if (!no_sync && syncer && qk__mutex_init(&w->mu) == 0) {
        if (qk__cond_init(&w->cv) == 0) {
            if (qk__thread_start(&w->syncer, qk__npyw_syncer, w)) w->syncer_on = 1;
            else qk__cond_destroy(&w->cv);
        }
        if (!w->syncer_on) qk__mutex_destroy(&w->mu);
    }
    return QK_OK;
#endif
}

/* n bytes of K's data at byte offset off (from the start of the data), through fd: w->fd, or
   (several GPUs) a thread's own descriptor of the temporary file (its own file offset); the
   byte counts are then shared: w->written is added atomically, the syncer's under w->mu. */
QK__PRIV qk_result qk__npyw_at_fd(qk__npyw *w, int fd, uint64_t off, const void *buf, size_t n)
{
    if (w->cancel && QK__LOAD(w->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (lseek(fd, (off_t)(w->hdr + off), SEEK_SET) < 0 || qk__write_all(fd, buf, n) != 0) {
        int e = errno;
        return qk__fail(QK_ERROR_IO, "cannot write '%s': writing %.3g MB at byte %llu failed: %s%s", w->path,
                        (double)n * 1e-6, (unsigned long long)(w->hdr + off), strerror(e),
                        e == ENOSPC ? " (the file system is full; nothing was left behind)" : "");
    }
    (void)QK__FETCH_ADD(&w->written, (uint64_t)n);
    if (w->syncer_on) {
        qk__mutex_lock(&w->mu);
        w->dirty += n;
        w->written_mt += n;
        if (w->dirty >= QK__NPYW_SYNC_BYTES) qk__cond_broadcast(&w->cv);
        /* backpressure: at most QK__NPYW_MAX_DIRTY unsynced (woken after each fsync) */
        while (w->written_mt - w->synced > QK__NPYW_MAX_DIRTY && !w->sync_errno && !(w->cancel && QK__LOAD(w->cancel)))
            qk__cond_wait(&w->cv, &w->mu);
        qk__mutex_unlock(&w->mu);
    }
    return QK_OK;
}

QK__PRIV qk_result qk__npyw_at(qk__npyw *w, uint64_t off, const void *buf, size_t n)
{
    return qk__npyw_at_fd(w, w->fd, off, buf, n);
}

/* K[i0 + a][j0 .. j0 + n) = src[a * ld ..] for a < m (elements of the output dtype). */
QK__PRIV qk_result qk__npyw_rows(qk__npyw *w, int64_t i0, int64_t j0, int64_t m, int64_t n, const void *src, int64_t ld)
{
    const char *p = (const char *)src;
    int64_t a;
    QK_ASSERT(i0 >= 0 && j0 >= 0 && i0 + m <= w->rows && j0 + n <= w->cols && ld >= n); /* inside K */
    if (j0 == 0 && n == w->cols && ld == w->cols)
        return qk__npyw_at(w, (uint64_t)i0 * (uint64_t)w->cols * w->es, p, (size_t)(m * n) * w->es);
    for (a = 0; a < m; a++) {
        qk_result r = qk__npyw_at(w, ((uint64_t)(i0 + a) * (uint64_t)w->cols + (uint64_t)j0) * w->es,
                                  p + (size_t)(a * ld) * w->es, (size_t)n * w->es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* Every byte of K written: sync (unless no_sync), rename over the target, sync the directory. */
QK__PRIV qk_result qk__npyw_commit(qk__npyw *w)
{
    const char *what = "fsync";
    int e = 0;
    qk__npyw_stop_syncer(w);
    e = w->sync_errno;
    if (w->written != (uint64_t)w->rows * (uint64_t)w->cols * w->es) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': %llu of %llu bytes of K were written (internal error)", w->path,
                               (unsigned long long)w->written, (unsigned long long)((uint64_t)w->rows * (uint64_t)w->cols * w->es));
        qk__npyw_abort(w);
        return r;
    }
    if (!e && !w->no_sync && QK__FSYNC(w->fd) != 0) e = errno;
    if (!e) {
        what = "close";
        if (QK__CLOSE(w->fd) != 0) e = errno;
        w->fd = -1;
    }
    if (e) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s failed: %s", w->path, what, strerror(e));
        qk__npyw_abort(w);
        return r;
    }
    {
        qk_result r = qk__tmp_commit(w->tmp, w->path, w->no_sync);
        QK_FREE(w->tmp);
        w->tmp = NULL;
        return r;
    }
}

#if defined(QK_CUDA) && QK_CUDA
/* Another descriptor of the open temporary file (several GPUs: one per host thread, each with
   its own file offset, for qk__npyw_at_fd); the caller closes it. */
QK__PRIV qk_result qk__npyw_fd(const qk__npyw *w, int *fd)
{
    *fd = w->tmp ? open(w->tmp, O_WRONLY) : -1;
    if (*fd < 0) return qk__fail(QK_ERROR_IO, "cannot write '%s': cannot open '%s' again: %s", w->path, w->tmp ? w->tmp : "?", strerror(errno));
    return QK_OK;
}
#endif
/* ---- end streaming .npy writer ---- */

/* >>sink ---- the output of a Gram: opened once, written by the executor, committed once ---- */
/* qk_gram validates, plans, opens ONE sink for the plan's output and hands plan and sink to the
   executor the plan names (the CPU engine, the MPS engine, the GPU engine on one or several
   GPUs). Executors write into it (the caller's host or device buffer, the tile callback, the
   .npy file's temporary through its writer) and never open, commit or remove a file; qk_gram
   closes the sink: on success the .npy is synced and renamed over out_path (qk__npyw_commit), on
   any failure or cancel its temporary is removed and out_path is untouched (qk__npyw_abort).
   qk_gram_mpi's MPI-IO file takes the same temporary, rename and removal steps (qk__open_tmp,
   qk__tmp_commit, qk__tmp_discard). */
/* qk__sink: in qk_internal.h (the executors write into it) */

/* Opens the sink of plan's output (desc: the caller's buffer, callback or path). NPY creates the
   temporary file; its writer syncs in the background (a syncer thread) unless the writes are the
   CPU engine's symmetric mirror strips (scattered: written back while the job runs they would be
   random I/O a cancel must wait for; the final sync then does it). */
QK__PRIV qk_result qk__sink_open(qk__sink *s, const qk_plan *plan, const qk_gram_desc *desc)
{
    memset(s, 0, sizeof *s);
    s->npy.fd = -1;
    s->kind = plan->output;
    s->dtype = plan->out_dtype;
    s->es = plan->out_dtype == QK_F32 ? 4 : 8;
    s->rows = plan->n_x;
    s->cols = plan->n_y;
    s->out = desc->out;
    s->ld = desc->ld_out ? desc->ld_out : plan->n_y;
    s->tile_fn = desc->tile_fn;
    s->tile_user = desc->tile_user;
    if (s->kind != QK_OUTPUT_NPY) return QK_OK;
    return qk__npyw_open(&s->npy, desc->out_path, s->dtype, s->rows, s->cols, desc->no_sync,
                         !(plan->backend == QK_BACKEND_CPU && plan->symmetric));
}

/* Closes the sink after the executor returned r: QK_OK commits (NPY: every byte written, sync,
   rename), anything else discards (NPY: the temporary removed). Returns the job's result. */
QK__PRIV qk_result qk__sink_close(qk__sink *s, qk_result r)
{
    if (s->kind != QK_OUTPUT_NPY) return r;
    if (r == QK_OK) {
        QK_PROF_BEGIN("npy commit");
        r = qk__npyw_commit(&s->npy);
        QK_PROF_END("npy commit");
    } else qk__npyw_abort(&s->npy);
    return r;
}
/* ---- end sink ---- */

/* >>cpu_stream ---- CPU engine, streamed output ---- */
/* The symmetric slab's lower part, written by the writer: for rows c >= the slab's end, the
   strip K[c][rb .. rb + m) = U[0 .. m)[c]^T, transposed through a small buffer (columns in
   blocks of 64, one write per row of K). */
static qk_result qk__cpu_write_strips(qk__npyw *w, const char *U, int64_t ld, int64_t rb, int64_t m, char *tb,
                                       qk__gram_job *job)
{
    const size_t es = w->es;
    int64_t c0, c, a;
    for (c0 = rb + m; c0 < w->cols; c0 += 64) {
        qk__job_poll(job);
        int64_t nc = w->cols - c0 < 64 ? w->cols - c0 : 64;
        for (a = 0; a < m; a++)
            for (c = 0; c < nc; c++) memcpy(tb + (size_t)(c * m + a) * es, U + (size_t)(a * ld + c0 + c) * es, es);
        for (c = 0; c < nc; c++) {
            qk_result r = qk__npyw_at(w, ((uint64_t)(c0 + c) * (uint64_t)w->cols + (uint64_t)rb) * es, tb + (size_t)(c * m) * es, (size_t)m * es);
            if (r != QK_OK) return r;
        }
    }
    return QK_OK;
}

/* One slab of streamed output: rows [rb, rb + m) of K in U (ld = columns). Symmetric: each
   row from column rb on (the part left of rb came with earlier slabs' strips), then the strips
   below the slab. */
typedef struct qk__slab_write {
    qk__npyw *w;
    qk__gram_job *job;
    const char *U;
    int64_t rb, m;
    int symmetric;
    char *tb;
    qk_result r;
    char err[512];
} qk__slab_write;

static void *qk__slab_write_main(void *p)
{
    qk__slab_write *s = (qk__slab_write *)p;
    qk__npyw *w = s->w;
    if (!s->symmetric) s->r = qk__npyw_rows(w, s->rb, 0, s->m, w->cols, s->U, w->cols);
    else {
        s->r = qk__npyw_rows(w, s->rb, s->rb, s->m, w->cols - s->rb, s->U + (size_t)s->rb * w->es, w->cols);
        if (s->r == QK_OK) s->r = qk__cpu_write_strips(w, s->U, w->cols, s->rb, s->m, s->tb, s->job);
    }
    if (s->r != QK_OK) snprintf(s->err, sizeof s->err, "%s", qk__errbuf); /* the detail is thread-local */
    return NULL;
}

/* Streamed output (QK_OUTPUT_NPY): slabs of plan->slab_rows rows computed into one of two slab
   buffers while a writer thread writes the previous slab. Symmetric K computes each unordered
   pair once; its mirror is written as strips (qk__cpu_write_strips). Host memory: the two slab
   buffers, not K. w: the sink's open .npy (qk_gram commits or discards it). */
QK__PRIV qk_result qk__cpu_gram_npy(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, int nt,
                                    const qk__cpu_tiles *tl, qk__npyw *w)
{
    qk__slab_write sw[2];
    char *U[2] = {NULL, NULL}, *tb = NULL;
    const size_t es = plan->out_dtype == QK_F32 ? 4 : 8;
    /* state tiles: a slab is one row block (its tiles move j's fields: keep K's shape here) */
    const int64_t SR = tl ? tl->R : plan->slab_rows > 0 ? plan->slab_rows : QK__T, nb = j->nb, na = j->na;
    const int sym = j->symmetric;
    int64_t rb, s;
    int pending = -1;   /* index of the slab buffer being written, or -1 */
    qk_result r;
    qk__thread wt;
    w->cancel = &j->cancel;  /* the writer of the slab in flight stops with the job */
    U[0] = (char *)qk__malloc((size_t)SR * (size_t)nb * es);
    U[1] = (char *)qk__malloc((size_t)SR * (size_t)nb * es);
    tb = (char *)qk__malloc((size_t)SR * 64 * es);
    if (!U[0] || !U[1] || !tb) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: cannot allocate two slabs of %lld x %lld for the streamed output", (long long)SR, (long long)nb);
        goto done;
    }
    for (s = 0, rb = 0; rb < na; rb += SR, s++) {
        int b = (int)(s & 1);
        qk__slab_write *cur = &sw[b];
        const int64_t m = na - rb < SR ? na - rb : SR;
        qk_result rr = QK_OK;
        if (tl) {
            j->ld = nb;
            rr = qk__cpu_row_block(tl, j, rb, m, U[b], NULL, nt);
        } else {
            j->out = U[b];
            j->ld = nb;
            j->row_base = rb;
            j->mirror_end = rb + m;
            j->ti_begin = rb / QK__T;
            j->ti_end = (rb + m + QK__T - 1) / QK__T;
            j->n_tiles = 0;
            {
                int64_t t;
                for (t = j->ti_begin; t < j->ti_end; t++) j->n_tiles += j->symmetric ? j->tiles_j - t : j->tiles_j;
            }
            j->next = 0;
            QK_PROF_BEGIN("gram slab");
            qk__cpu_run_tiles(j, nt);
            QK_PROF_END("gram slab");
        }
        if (pending >= 0) { /* the previous slab's writer */
            qk__thread_join(wt);
            if (sw[pending].r != QK_OK && sw[pending].r != QK_ERROR_CANCELLED) { r = qk__fail(sw[pending].r, "%s", sw[pending].err); pending = -1; goto done; }
            pending = -1;
        }
        if (rr != QK_OK) { r = rr; goto done; }
        if (j->oom || j->cancel) break;
        memset(cur, 0, sizeof *cur);
        cur->w = w; cur->job = j; cur->U = U[b]; cur->rb = rb; cur->m = m; cur->symmetric = sym; cur->tb = tb;
        if (qk__thread_start(&wt, qk__slab_write_main, cur)) { pending = b; continue; }
        qk__slab_write_main(cur);
        if (cur->r != QK_OK) { r = qk__fail(cur->r, "%s", cur->err); goto done; }
    }
    if (pending >= 0) {
        qk__thread_join(wt);
        if (sw[pending].r != QK_OK && sw[pending].r != QK_ERROR_CANCELLED) { r = qk__fail(sw[pending].r, "%s", sw[pending].err); pending = -1; goto done; }
        pending = -1;
    }
    /* a last word from the progress callback before the file replaces the old one (the polls
       during the job are try-locks and may have missed the last tiles) */
    if (!j->oom && !j->cancel && j->progress && j->progress(j->pairs_done, j->pairs_total, j->progress_user)) j->cancel = 1;
    if (j->oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: out of host memory for tile buffers"); goto done; }
    if (j->cancel) { r = qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback after %lld of %lld pairs; '%s' was not written", (long long)j->pairs_done, (long long)j->pairs_total, desc->out_path); goto done; }
    r = QK_OK;
done:
    w->cancel = NULL;
    QK_FREE(U[0]);
    QK_FREE(U[1]);
    QK_FREE(tb);
    return r;
}


/* >>cpu_run ---- CPU engine: a job run (all of K, state tiles, streamed), qk__cpu_gram ---- */

/* Runs a job set up by qk__cpu_job_init: all of K, streamed (NPY, into the sink's file), or (tl)
   by state tiles. */
static qk_result qk__cpu_gram_exec(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const qk__cpu_tiles *tl,
                                   qk__sink *sink)
{
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk_result r = QK_OK;
    if (sink->kind == QK_OUTPUT_NPY) r = qk__cpu_gram_npy(plan, desc, j, nt, tl, &sink->npy);
    else if (tl) {
        const size_t es = j->dt == QK_F32 ? 4 : 8;
        char *K = sink->kind == QK_OUTPUT_HOST ? (char *)sink->out : NULL;
        int64_t i0;
        for (i0 = 0; i0 < desc->n_x && r == QK_OK && !j->cancel && !j->oom; i0 += tl->R)
            r = qk__cpu_row_block(tl, j, i0, desc->n_x - i0 < tl->R ? desc->n_x - i0 : tl->R,
                                  K ? K + (size_t)i0 * (size_t)j->ld * es : NULL, K, nt);
    } else qk__cpu_run_tiles(j, nt);
    if (r != QK_OK) return r;
    if (j->oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "gram: out of host memory for tile buffers");
    if (j->cancel) return qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback after %lld of %lld pairs (output partly written)", (long long)j->pairs_done, (long long)j->pairs_total);
    if (desc->progress) desc->progress(j->pairs_total, j->pairs_total, desc->progress_user);
    return QK_OK;
}

/* The job for all of K from the states A and B (B == A for K(X,X)), or NULL and NULL (set
   after the states are built, with the job polled meanwhile), into the sink's output;
   qk__cpu_job_free ends it. */
QK__PRIV void qk__cpu_job_init(qk__gram_job *j, const qk_plan *plan, const qk_gram_desc *desc, const qk__sink *sink, const double *A,
                               const double *B, int64_t stride, int64_t D, const void *mps, size_t scratch)
{
    int64_t nb = desc->y ? desc->n_y : desc->n_x;
    memset(j, 0, sizeof *j);
    j->path = plan->path;
    j->linear = plan->linear;
    j->A = A;
    j->B = B;
    j->na = desc->n_x;
    j->nb = nb;
    j->stride = stride;
    j->D = D;
    j->mps = mps;
    j->scratch = scratch;
    j->symmetric = desc->y == NULL;
    j->dt = plan->out_dtype;
    j->out = sink->out;
    j->ld = sink->ld;
    j->output = sink->kind;
    j->tile_fn = sink->tile_fn;
    j->tile_user = sink->tile_user;
    j->progress = desc->progress;
    j->progress_user = desc->progress_user;
    j->tiles_i = (j->na + QK__T - 1) / QK__T;
    j->tiles_j = (j->nb + QK__T - 1) / QK__T;
    j->n_tiles = j->symmetric ? j->tiles_i * (j->tiles_i + 1) / 2 : j->tiles_i * j->tiles_j;
    j->ti_begin = 0;
    j->ti_end = j->tiles_i;
    j->row_base = 0;
    j->mirror_end = INT64_MAX;
    j->pairs_total = j->na * j->nb;
    j->isa = qk__cpu_isa();   /* the kernels of the whole job (cpu_pool.c) */
    (void)qk__mutex_init(&j->cb_lock);
}

QK__PRIV void qk__cpu_job_free(qk__gram_job *j)
{
    qk__mutex_destroy(&j->cb_lock);
}

/* A job cancelled while its states were built, before any of K (bulk states, MPS). */
static qk_result qk__cpu_states_cancelled(const qk__gram_job *j)
{
    return qk__fail(QK_ERROR_CANCELLED, "gram: cancelled by a callback while the states were built (0 of %lld pairs; the output was not written)",
                    (long long)j->pairs_total);
}

/* K from the states A and B (B == A for K(X,X)) in the engine's layout for plan->path, built with
   j (qk__cpu_job_init with no states) polled: the tiles, all of K or streamed (NPY), with
   callbacks, progress and cancel; or the cancel that came while the states were built. A, B:
   NULL where memory ran out (the error is set); B NULL for K(X,X) or where the cancel came
   before Y's states. */
QK__PRIV qk_result qk__cpu_gram_run(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const double *A, const double *B,
                                    qk__sink *sink)
{
    if (j->provider_failed) return j->provider_failed;
    if (!A) return QK_ERROR_OUT_OF_MEMORY;
    if (j->cancel) return qk__cpu_states_cancelled(j);
    if (desc->y && !B) return QK_ERROR_OUT_OF_MEMORY;
    j->A = A;
    j->B = B ? B : A;
    return qk__cpu_gram_exec(plan, desc, j, NULL, sink);
}

/* K with state tiles (plan->bulk_states == 0): two blocks of plan->state_tile states. */
static qk_result qk__cpu_gram_tiled(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
{
    qk__cpu_tiles t;
    qk__gram_job j;
    const qk_path path = plan->path;
    const int64_t stride = qk__row_len(map, path), nb = desc->y ? desc->n_y : desc->n_x;
    const int64_t R = plan->state_tile;
    qk_result r;
    if (R < 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "gram: a plan with state tiles of %lld samples", (long long)R);
    memset(&t, 0, sizeof t);
    t.map = map;
    t.desc = desc;
    t.path = path;
    t.R = R;
    if ((double)R * (double)stride * 8.0 > 9.0e18) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "states: %lld x %lld doubles overflow", (long long)R, (long long)stride);
    t.A = (double *)qk__malloc(sizeof(double) * (size_t)(R * stride));
    if (t.A && (desc->y || R < nb)) t.B = (double *)qk__malloc(sizeof(double) * (size_t)(R * stride));
    if (!t.A || ((desc->y || R < nb) && !t.B)) {
        QK_FREE(t.A);
        QK_FREE(t.B);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "states: cannot allocate two tiles of %lld states (%.3g GB of host memory)",
                        (long long)R, 2.0 * (double)R * (double)stride * 8e-9);
    }
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, stride, path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    r = qk__cpu_gram_exec(plan, desc, &j, &t, sink);
    qk__cpu_job_free(&j);
    QK_FREE(t.A);
    QK_FREE(t.B);
    return r;
}

/* The CPU engine's Gram into the sink; desc validated, plan made, sink opened (qk_gram). */
QK__PRIV qk_result qk__cpu_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
{
    qk_path path = plan->path;
    double *A = NULL, *B = NULL;
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    qk__gram_job j;
    qk_result r;
    if (!plan->bulk_states) return qk__cpu_gram_tiled(plan, map, desc, sink);
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, qk__row_len(map, path),
                     path == QK_PATH_ANALYTIC ? map->n_qubits : ((int64_t)1 << map->n_qubits), NULL, 0);
    A = qk__cpu_states(map, desc->x, 0, desc->n_x, path, nt, &j);
    if (A && desc->y && !j.cancel) B = qk__cpu_states(map, desc->y, 0, desc->n_y, path, nt, &j);
    r = qk__cpu_gram_run(plan, desc, &j, A, B, sink);
    qk__cpu_job_free(&j);
    QK_FREE(A);
    QK_FREE(B);
    return r;
}
/* >>schedule_impl ---- the work schedule (K dealt to MPI ranks x GPUs) ---- */
/* The schedule (declared with qk_schedule_desc): P(r), the pairs of rows [0, r), is r n_y for
   K(X,Y) and r n - r (r - 1) / 2 for the upper triangle of K(X,X) (row i has n - i pairs); cut k
   is the aligned row whose P is closest to the weighted share of workers 0 .. k-1. */
static int64_t qk__sched_pairs_before(int64_t r, int64_t n, int64_t n_y)
{
    return n_y > 0 ? r * n_y : r * n - r * (r - 1) / 2;
}

QKDEF void qk_schedule_free(qk_schedule *s)
{
    if (!s) return;
    QK_FREE(s->items);   /* the one allocation holding every array */
    memset(s, 0, sizeof *s);
}

QKDEF qk_result qk_schedule_make(const qk_schedule_desc *desc, qk_schedule *out)
{
    qk_schedule s;
    int64_t n, ny, align, total;
    int W, w, k;
    double wsum = 0.0, acc = 0.0, worst = 0.0;
    size_t bytes;
    char *mem;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: out is NULL");
    memset(out, 0, sizeof *out);
    if (!desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: desc is NULL");
    n = desc->n_x;
    ny = desc->n_y;
    W = desc->n_workers;
    if (n <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_x must be > 0 (got %lld)", (long long)n);
    if (ny < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_y must be >= 0 (got %lld)", (long long)ny);
    if (W <= 0 || W > (1 << 24)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_workers must be in [1, 2^24] (got %d)", W);
    if (desc->align < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: align must be >= 0 (got %lld)", (long long)desc->align);
    if (ny > 0 ? n > INT64_MAX / 4 / ny : n > ((int64_t)1 << 31))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: K of %lld x %lld is too large", (long long)n, (long long)(ny ? ny : n));
    for (w = 0; w < W; w++) {
        double v = desc->weights ? desc->weights[w] : 1.0;
        if (!(v > 0.0) || !isfinite(v))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: weights[%d] = %g (weights must be finite and > 0)", w, v);
        wsum += v;
    }
    align = desc->align;
    if (align == 0)
        for (align = 64; align > 1 && n < 64 * align * (int64_t)W; align /= 2) {}
    total = qk__sched_pairs_before(n, n, ny);

    memset(&s, 0, sizeof s);
    bytes = sizeof(qk_work_item) * 2 * (size_t)W + sizeof(int64_t) * (2 * (size_t)W + 1) + sizeof(int) * ((size_t)W + 1);
    mem = (char *)qk__malloc(bytes);
    if (!mem) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_schedule_make: out of memory (%d workers)", W);
    s.items = (qk_work_item *)(void *)mem;
    s.row0 = (int64_t *)(void *)(mem + sizeof(qk_work_item) * 2 * (size_t)W);
    s.pairs = s.row0 + W + 1;
    s.first = (int *)(void *)(s.pairs + W);
    s.n_workers = W;
    s.align = align;
    s.pairs_total = total;

    s.row0[0] = 0;
    s.row0[W] = n;
    for (k = 1; k < W; k++) {
        double T, r, disc;
        int64_t lo, c[3], best;
        int i;
        acc += desc->weights ? desc->weights[k - 1] : 1.0;
        T = (double)total * (acc / wsum);
        if (ny > 0) r = T / (double)ny;
        else {
            disc = (2.0 * (double)n + 1.0) * (2.0 * (double)n + 1.0) - 8.0 * T;
            r = ((2.0 * (double)n + 1.0) - sqrt(disc > 0.0 ? disc : 0.0)) / 2.0;
        }
        if (r < 0.0) r = 0.0;
        if (r > (double)n) r = (double)n;
        lo = (int64_t)(r / (double)align) * align;
        c[0] = lo - align; c[1] = lo; c[2] = lo + align;
        best = -1;
        for (i = 0; i < 3; i++) {
            int64_t v = c[i] < s.row0[k - 1] ? s.row0[k - 1] : c[i] > n ? n : c[i];
            if (best < 0 || fabs((double)qk__sched_pairs_before(v, n, ny) - T) < fabs((double)qk__sched_pairs_before(best, n, ny) - T))
                best = v;
        }
        s.row0[k] = best;
        QK_ASSERT(s.row0[k] >= s.row0[k - 1] && s.row0[k] <= n); /* bands ascend inside [0, n] */
    }

    for (w = 0; w < W; w++) {
        int64_t a = s.row0[w], b = s.row0[w + 1], h = b - a;
        double omega = (desc->weights ? desc->weights[w] : 1.0) / (wsum / (double)W), t;
        s.first[w] = s.n_items;
        s.pairs[w] = 0;
        if (h > 0) {
            qk_work_item *it = &s.items[s.n_items++];
            it->worker = w;
            it->i0 = a; it->i1 = b;
            if (ny > 0) { it->j0 = 0; it->j1 = ny; it->symmetric = 0; it->pairs = h * ny; }
            else { it->j0 = a; it->j1 = b; it->symmetric = 1; it->pairs = h * (h + 1) / 2; }
            s.pairs[w] += it->pairs;
            if (ny == 0 && b < n) {
                it = &s.items[s.n_items++];
                it->worker = w;
                it->i0 = a; it->i1 = b; it->j0 = b; it->j1 = n; it->symmetric = 0;
                it->pairs = h * (n - b);
                s.pairs[w] += it->pairs;
            }
        }
        t = (double)s.pairs[w] / omega;
        if (t > worst) worst = t;
    }
    s.first[W] = s.n_items;
    QK_ASSERT(s.n_items <= 2 * W); /* the items array holds two per worker */
    s.imbalance = worst / ((double)total / (double)W);
    *out = s;
    return QK_OK;
}

/* ---- end work schedule ---- */
/* >>mps ---- the MPS engine ---- */
#ifndef QK_NO_MPS   /* the engine (QK_NO_MPS compiles it out: the planner keeps the statevector) */

/* ---- dense linear algebra for the sweeps (column-major complex, interleaved re/im) ---- */
#define QK__RE(X, ld, i, j) (X)[2 * ((size_t)(i) + (size_t)(j) * (size_t)(ld))]
#define QK__IM(X, ld, i, j) (X)[2 * ((size_t)(i) + (size_t)(j) * (size_t)(ld)) + 1]

/* Column c of A (m rows, column-major) times H = I - beta v v^H, v zero above row j: rows j..m-1
   of the column change (the QR's reflectors applied to X, and to Q to form it). */
static void qk__mps_reflect(double *A, int m, const double *v, double beta, int j, int c)
{
    double wr = 0, wi = 0;
    int i;
    for (i = j; i < m; i++) { /* w = v^H a_c */
        wr += v[2 * i] * QK__RE(A, m, i, c) + v[2 * i + 1] * QK__IM(A, m, i, c);
        wi += v[2 * i] * QK__IM(A, m, i, c) - v[2 * i + 1] * QK__RE(A, m, i, c);
    }
    wr *= beta; wi *= beta;
    for (i = j; i < m; i++) {
        QK__RE(A, m, i, c) -= wr * v[2 * i] - wi * v[2 * i + 1];
        QK__IM(A, m, i, c) -= wr * v[2 * i + 1] + wi * v[2 * i];
    }
}

/* Householder QR of X (m x n), k <= min(m, n) steps. pivot: each step first swaps in the column of
   largest remaining norm (perm[j] = the original column now at j). On return R is X's upper k rows
   (zero below the diagonal), Q (m x k) has orthonormal columns, X P = Q R + (trailing block).
   Returns the trailing block's Frobenius norm: what keeping k columns drops. V: m x k scratch. */
static double qk__mps_qr(double *X, int m, int n, int k, int pivot, int *perm, double *Q, double *V, double *beta)
{
    int i, j, c;
    double tail = 0;
    for (j = 0; j < n; j++) perm[j] = j;
    for (j = 0; j < k; j++) {
        double nrm2 = 0, nrm, xr, xi, ax, pr, pim, *v = V + 2 * (size_t)j * (size_t)m;
        if (pivot) {
            int best = j;
            double bn = -1;
            for (c = j; c < n; c++) {
                double s2 = 0;
                for (i = j; i < m; i++) s2 += QK__RE(X, m, i, c) * QK__RE(X, m, i, c) + QK__IM(X, m, i, c) * QK__IM(X, m, i, c);
                if (s2 > bn) { bn = s2; best = c; }
            }
            if (best != j) {
                int t = perm[j]; perm[j] = perm[best]; perm[best] = t;
                for (i = 0; i < m; i++) {
                    double tr = QK__RE(X, m, i, j), ti = QK__IM(X, m, i, j);
                    QK__RE(X, m, i, j) = QK__RE(X, m, i, best); QK__IM(X, m, i, j) = QK__IM(X, m, i, best);
                    QK__RE(X, m, i, best) = tr; QK__IM(X, m, i, best) = ti;
                }
            }
        }
        for (i = j; i < m; i++) nrm2 += QK__RE(X, m, i, j) * QK__RE(X, m, i, j) + QK__IM(X, m, i, j) * QK__IM(X, m, i, j);
        memset(v, 0, sizeof(double) * 2 * (size_t)m);
        /* a column of norm below 1e-140 is zero to the state (a unit vector): no reflection. Its
           beta, 1 / (nrm (nrm + |x_j|)), would overflow to inf from nrm ~ 1e-154 on, and inf x 0
           made NaN MPS (silently NaN rows of K: zz(reps=1) at 12 qubits, bond 64) */
        if (nrm2 < 1e-280) { beta[j] = 0; continue; }
        nrm = sqrt(nrm2);
        xr = QK__RE(X, m, j, j); xi = QK__IM(X, m, j, j);
        ax = sqrt(xr * xr + xi * xi);
        pr = ax > 0 ? xr / ax : 1.0; pim = ax > 0 ? xi / ax : 0.0;
        /* H = I - beta v v^H maps x to alpha e_j, alpha = -phase(x_j) ||x|| */
        v[2 * j] = xr + pr * nrm; v[2 * j + 1] = xi + pim * nrm;
        for (i = j + 1; i < m; i++) { v[2 * i] = QK__RE(X, m, i, j); v[2 * i + 1] = QK__IM(X, m, i, j); }
        beta[j] = 1.0 / (nrm * (nrm + ax));
        for (c = j + 1; c < n; c++) qk__mps_reflect(X, m, v, beta[j], j, c);
        QK__RE(X, m, j, j) = -pr * nrm; QK__IM(X, m, j, j) = -pim * nrm;
        for (i = j + 1; i < m; i++) { QK__RE(X, m, i, j) = 0; QK__IM(X, m, i, j) = 0; }
    }
    for (c = k; c < n; c++)
        for (i = k; i < m; i++) tail += QK__RE(X, m, i, c) * QK__RE(X, m, i, c) + QK__IM(X, m, i, c) * QK__IM(X, m, i, c);
    /* Q = H_0 ... H_{k-1} [I_k; 0] */
    memset(Q, 0, sizeof(double) * 2 * (size_t)m * (size_t)k);
    for (j = 0; j < k; j++) QK__RE(Q, m, j, j) = 1;
    for (j = k - 1; j >= 0; j--) {
        const double *v = V + 2 * (size_t)j * (size_t)m;
        if (beta[j] == 0) continue;
        for (c = j; c < k; c++) qk__mps_reflect(Q, m, v, beta[j], j, c);   /* columns < j of H_{j+1..} e are zero in rows >= j */
    }
    return sqrt(tail);
}

/* ---- building one sample's MPS ---- */
/* Work space of one thread: site s holds [dim[s]][2][dim[s+1]] complex, row-major, in a slot of
   capacity 2D[s] x 2 x 2D[s+1] (a bond at most doubles before it is compressed back to its bound). */
typedef struct qk__mps_work {
    double *buf, *tmp, *X, *Q, *V, *beta, *theta;
    int64_t *slot;      /* q: offset of site s in buf */
    int *dim, *bound, *perm;
    int lo, hi;         /* sites not known orthonormal since the last compression (lo < 0: none) */
    double discarded;   /* largest norm dropped by a compression (rounding) */
    int trunc;          /* truncation (prog max_bond / cutoff): SVD steps instead of exact ones */
    double cutoff;
    double angle;       /* this sample: sum over truncations of asin(sqrt(w_k)), w_k the share of
                           the weight dropped (the Fubini-Study distance it moved, at most) */
    double norm2;       /* this sample: the norm^2 left, prod (1 - w_k) */
} qk__mps_work;

static void qk__mps_work_free(qk__mps_work *w)
{
    if (!w) return;
    QK_FREE(w->buf); QK_FREE(w->tmp); QK_FREE(w->X); QK_FREE(w->Q); QK_FREE(w->V); QK_FREE(w->beta);
    QK_FREE(w->theta); QK_FREE(w->slot); QK_FREE(w->dim); QK_FREE(w->bound); QK_FREE(w->perm);
    memset(w, 0, sizeof *w);
}

static int qk__mps_work_init(qk__mps_work *w, const qk__mps_prog *p, const qk_map *m)
{
    int q = p->q, s, dmax = 1;
    int64_t tot = 0, smax = 0;
    size_t mn;
    memset(w, 0, sizeof *w);
    w->slot = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)q);
    w->dim = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    w->bound = (int *)qk__malloc(sizeof(int) * (size_t)(q + 1));
    w->theta = (double *)qk__malloc(sizeof(double) * (size_t)(m->n_ops + 1));
    if (!w->slot || !w->dim || !w->bound || !w->theta) return 0;
    for (s = 0; s < q; s++) {
        int64_t c = (int64_t)2 * p->D[s] * 2 * 2 * p->D[s + 1] * 2;   /* doubles */
        w->slot[s] = tot;
        tot += c;
        if (c > smax) smax = c;
    }
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    /* QR operands: at most (2 * 2dmax) x (2dmax) complex */
    mn = (size_t)4 * dmax * 2 * dmax;
    w->buf = (double *)qk__malloc(sizeof(double) * (size_t)tot);
    w->tmp = (double *)qk__malloc(sizeof(double) * (size_t)smax);
    w->X = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->Q = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->V = (double *)qk__malloc(sizeof(double) * 2 * mn);
    w->beta = (double *)qk__malloc(sizeof(double) * (size_t)(4 * dmax + 1));
    w->perm = (int *)qk__malloc(sizeof(int) * (size_t)(4 * dmax + 1));
    w->trunc = p->max_bond > 0 || p->cutoff > 0;
    w->cutoff = p->cutoff;
    return w->buf && w->tmp && w->X && w->Q && w->V && w->beta && w->perm;
}

#define QK__SITE(w, s) ((w)->buf + (w)->slot[s])

/* A[l][a][r] <- sum_b U[a][b] A[l][b][r]; U row-major complex (8 doubles) */
static void qk__mps_apply1(double *A, int dl, int dr, const double *U)
{
    int l, r;
    for (l = 0; l < dl; l++)
        for (r = 0; r < dr; r++) {
            double *a0 = A + 2 * ((size_t)(l * 2) * dr + r), *a1 = A + 2 * ((size_t)(l * 2 + 1) * dr + r);
            double r0 = a0[0], i0 = a0[1], r1 = a1[0], i1 = a1[1];
            a0[0] = U[0] * r0 - U[1] * i0 + U[2] * r1 - U[3] * i1;
            a0[1] = U[0] * i0 + U[1] * r0 + U[2] * i1 + U[3] * r1;
            a1[0] = U[4] * r0 - U[5] * i0 + U[6] * r1 - U[7] * i1;
            a1[1] = U[4] * i0 + U[5] * r0 + U[6] * i1 + U[7] * r1;
        }
}

/* The one-qubit matrix of op o at angle t (qk__u1); 0: identity (skip). */
static int qk__mps_u1(const qk_op *o, double t, const double *x, double *U)
{
    return qk__u1(o->kind, t, o->kind == QK_OP_BASIS && qk__basis_one(x[o->angle.x0]), U);
}

/* The two-qubit step as sum_t P_t (x) G_t (P_t on the op's q0): G[t] row-major complex 2x2. */
static void qk__mps_g2(const qk__mps_prog *p, const qk_map *m, const qk__mps_step *st, const double *theta, double G[2][8])
{
    double d0r = 1, d0i = 0, d1r = 1, d1i = 0;
    QK__UNUSED(p);
    memset(G, 0, sizeof(double) * 16);
    switch (st->gate) {
    case QK__MPS_CNOT:  /* I, X */
        G[0][0] = 1; G[0][6] = 1; G[1][2] = 1; G[1][4] = 1;
        return;
    case QK__MPS_CZ:    /* I, Z */
        G[0][0] = 1; G[0][6] = 1; G[1][0] = 1; G[1][6] = -1;
        return;
    case QK__MPS_RZZ: { /* e^{-it/2} where the bits agree, e^{it/2} where they differ */
        double c = cos(0.5 * theta[st->op]), s = sin(0.5 * theta[st->op]);
        G[0][0] = c; G[0][1] = -s; G[0][6] = c; G[0][7] = s;
        G[1][0] = c; G[1][1] = s; G[1][6] = c; G[1][7] = -s;
        return;
    }
    case QK__MPS_PARITY: default: {
        /* CX(a,b) D(b) CX(a,b), D = diag(d0, d1): diag(d0, d1) on b where a = 0, diag(d1, d0) where a = 1 */
        const qk_op *o = &m->ops[st->op];
        double t = theta[st->op], c = cos(0.5 * t), s = sin(0.5 * t);
        if (o->kind == QK_OP_P) { d1r = cos(t); d1i = sin(t); }
        else if (o->kind == QK_OP_RZ) { d0r = c; d0i = -s; d1r = c; d1i = s; }
        else { d1r = -1; } /* Z */
        G[0][0] = d0r; G[0][1] = d0i; G[0][6] = d1r; G[0][7] = d1i;
        G[1][0] = d1r; G[1][1] = d1i; G[1][6] = d0r; G[1][7] = d0i;
        return;
    }
    }
}

/* Applies sum_t P_t (x) G_t to sites s0 < s1 as an MPO of bond 2 (bonds s0+1 .. s1 double). */
static void qk__mps_apply2(qk__mps_work *w, const qk__mps_step *st, double G[2][8])
{
    int s, l, a, b, r, t;
    for (s = st->s0; s <= st->s1; s++) {
        int dl = w->dim[s], dr = w->dim[s + 1];
        double *A = QK__SITE(w, s), *T = w->tmp;
        int nl = s == st->s0 ? dl : 2 * dl, nr = s == st->s1 ? dr : 2 * dr;
        memset(T, 0, sizeof(double) * 2 * (size_t)nl * 2 * (size_t)nr);
        for (t = 0; t < 2; t++) {
            const int end = s == st->s0 || s == st->s1;
            const int proj = end && ((s == st->s0) == (st->proj_left != 0));
            const int lo = s == st->s0 ? 0 : t * dl, ro = s == st->s1 ? 0 : t * dr;
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (r = 0; r < dr; r++) {
                        double *o = T + 2 * (((size_t)(lo + l) * 2 + a) * nr + ro + r), vr = 0, vi = 0;
                        if (!end || proj) {
                            if (end && a != t) continue;
                            vr = A[2 * (((size_t)l * 2 + a) * dr + r)];
                            vi = A[2 * (((size_t)l * 2 + a) * dr + r) + 1];
                        } else {
                            for (b = 0; b < 2; b++) {
                                double gr = G[t][2 * (a * 2 + b)], gi = G[t][2 * (a * 2 + b) + 1];
                                double xr = A[2 * (((size_t)l * 2 + b) * dr + r)], xi = A[2 * (((size_t)l * 2 + b) * dr + r) + 1];
                                vr += gr * xr - gi * xi;
                                vi += gr * xi + gi * xr;
                            }
                        }
                        o[0] = vr; o[1] = vi;
                    }
        }
        memcpy(A, T, sizeof(double) * 2 * (size_t)nl * 2 * (size_t)nr);
    }
    for (b = st->s0 + 1; b <= st->s1; b++) w->dim[b] *= 2;
}

/* Site s left-orthonormal by QR; R moves into site s+1 (the bond may shrink to min(2 dl, dr)). */
static void qk__mps_qr_right(qk__mps_work *w, int s)
{
    int dl = w->dim[s], dr = w->dim[s + 1], d2 = w->dim[s + 2], m = 2 * dl, n = dr, k = m < n ? m : n;
    int i, c, t, a, r;
    double *A = QK__SITE(w, s), *B = QK__SITE(w, s + 1), *X = w->X, *Q = w->Q;
    for (i = 0; i < m; i++)
        for (c = 0; c < n; c++) { QK__RE(X, m, i, c) = A[2 * ((size_t)i * n + c)]; QK__IM(X, m, i, c) = A[2 * ((size_t)i * n + c) + 1]; }
    qk__mps_qr(X, m, n, k, 0, w->perm, Q, w->V, w->beta);
    for (i = 0; i < m; i++)
        for (t = 0; t < k; t++) { A[2 * ((size_t)i * k + t)] = QK__RE(Q, m, i, t); A[2 * ((size_t)i * k + t) + 1] = QK__IM(Q, m, i, t); }
    /* B'[t][a][r] = sum_{c >= t} R[t][c] B[c][a][r] */
    memset(w->tmp, 0, sizeof(double) * 2 * (size_t)k * 2 * (size_t)d2);
    for (t = 0; t < k; t++)
        for (c = t; c < n; c++) {
            double rr = QK__RE(X, m, t, c), ri = QK__IM(X, m, t, c);
            const double *src = B + 2 * (size_t)c * 2 * d2;
            double *dst = w->tmp + 2 * (size_t)t * 2 * d2;
            if (rr == 0 && ri == 0) continue;
            for (a = 0; a < 2; a++)
                for (r = 0; r < d2; r++) {
                    size_t e = 2 * ((size_t)a * d2 + r);
                    dst[e] += rr * src[e] - ri * src[e + 1];
                    dst[e + 1] += rr * src[e + 1] + ri * src[e];
                }
        }
    memcpy(B, w->tmp, sizeof(double) * 2 * (size_t)k * 2 * (size_t)d2);
    w->dim[s + 1] = k;
}

/* Site s right-orthonormal by a pivoted QR of its conjugate transpose, keeping at most kmax rows;
   the factor moves into site s-1. Returns the norm dropped (zero but for rounding when kmax is
   at least the bond's Schmidt rank and the sites right of s are right-orthonormal). */
static double qk__mps_trunc_left(qk__mps_work *w, int s, int kmax)
{
    int dl = w->dim[s], dr = w->dim[s + 1], d0 = w->dim[s - 1], m = 2 * dr, n = dl, k, i, j, t, l;
    double *A = QK__SITE(w, s), *P = QK__SITE(w, s - 1), *X = w->X, *Q = w->Q, disc;
    k = m < n ? m : n;
    if (kmax < k) k = kmax;
    /* X = M^H, M = A as dl x 2dr row-major: X column-major is A's storage, conjugated */
    for (i = 0; i < 2 * m * n; i += 2) { X[i] = A[i]; X[i + 1] = -A[i + 1]; }
    disc = qk__mps_qr(X, m, n, k, 1, w->perm, Q, w->V, w->beta);
    /* A'[t][c] = conj(Q[c][t]) */
    for (t = 0; t < k; t++)
        for (i = 0; i < m; i++) { A[2 * ((size_t)t * m + i)] = QK__RE(Q, m, i, t); A[2 * ((size_t)t * m + i) + 1] = -QK__IM(Q, m, i, t); }
    /* W[perm[j]][t] = conj(R[t][j]); P'[(l', a)][t] = sum_l P[(l', a)][l] W[l][t] */
    memset(w->tmp, 0, sizeof(double) * 2 * (size_t)d0 * 2 * (size_t)k);
    for (j = 0; j < n; j++) {
        int pl = w->perm[j];
        for (t = 0; t < k && t <= j; t++) {
            double wr = QK__RE(X, m, t, j), wi = -QK__IM(X, m, t, j);
            if (wr == 0 && wi == 0) continue;
            for (l = 0; l < 2 * d0; l++) {
                const double *src = P + 2 * ((size_t)l * n + pl);
                double *dst = w->tmp + 2 * ((size_t)l * k + t);
                dst[0] += src[0] * wr - src[1] * wi;
                dst[1] += src[0] * wi + src[1] * wr;
            }
        }
    }
    memcpy(P, w->tmp, sizeof(double) * 2 * (size_t)d0 * 2 * (size_t)k);
    w->dim[s] = k;
    return disc;
}

/* ---- truncation (qk_gram_desc.mps_max_bond / mps_cutoff) ---- */
/* Eigen-decomposition of the Hermitian n x n matrix G (row-major complex, destroyed) by cyclic
   Jacobi rotations: G's diagonal ends as the eigenvalues, V (row-major) holds the eigenvectors as
   columns. A rotation on (p, q) is J = diag(1, e^{-i phi}) [[c, s], [-s, c]], phi the phase of
   G[p][q]: J^H G J has a zero (p, q) entry (the real Jacobi rotation of the phase-rotated block). */
static void qk__mps_jacobi(double *G, double *V, int n)
{
    int sweep, p, q, k;
    memset(V, 0, sizeof(double) * 2 * (size_t)n * (size_t)n);
    for (p = 0; p < n; p++) V[2 * ((size_t)p * n + p)] = 1;
    for (sweep = 0; sweep < 64; sweep++) {
        double off = 0, dg = 0;
        for (p = 0; p < n; p++) {
            dg += G[2 * ((size_t)p * n + p)] * G[2 * ((size_t)p * n + p)];
            for (q = p + 1; q < n; q++) off += G[2 * ((size_t)p * n + q)] * G[2 * ((size_t)p * n + q)] + G[2 * ((size_t)p * n + q) + 1] * G[2 * ((size_t)p * n + q) + 1];
        }
        if (off == 0 || off <= 1e-32 * dg) break;
        for (p = 0; p < n; p++)
            for (q = p + 1; q < n; q++) {
                double hr = G[2 * ((size_t)p * n + q)], hi = G[2 * ((size_t)p * n + q) + 1], h = sqrt(hr * hr + hi * hi);
                double app, aqq, zeta, t, c, sn, er, ei;
                if (h == 0) continue;
                app = G[2 * ((size_t)p * n + p)]; aqq = G[2 * ((size_t)q * n + q)];
                zeta = (aqq - app) / (2 * h);
                t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                c = 1 / sqrt(1 + t * t); sn = t * c;
                er = hr / h; ei = hi / h;   /* e^{i phi} */
                for (k = 0; k < n; k++) {   /* G <- G J, V <- V J: col p = c p - s e^{-i phi} q, col q = s p + c e^{-i phi} q */
                    double *gp = G + 2 * ((size_t)k * n + p), *gq = G + 2 * ((size_t)k * n + q);
                    double *vp = V + 2 * ((size_t)k * n + p), *vq = V + 2 * ((size_t)k * n + q);
                    double xr = er * gq[0] + ei * gq[1], xi = er * gq[1] - ei * gq[0];   /* e^{-i phi} gq */
                    double yr = er * vq[0] + ei * vq[1], yi = er * vq[1] - ei * vq[0];
                    double pr = gp[0], pi = gp[1], ur = vp[0], ui = vp[1];
                    gp[0] = c * pr - sn * xr; gp[1] = c * pi - sn * xi;
                    gq[0] = sn * pr + c * xr; gq[1] = sn * pi + c * xi;
                    vp[0] = c * ur - sn * yr; vp[1] = c * ui - sn * yi;
                    vq[0] = sn * ur + c * yr; vq[1] = sn * ui + c * yi;
                }
                for (k = 0; k < n; k++) {   /* G <- J^H G: row p = c p - s e^{i phi} q, row q = s p + c e^{i phi} q */
                    double *gp = G + 2 * ((size_t)p * n + k), *gq = G + 2 * ((size_t)q * n + k);
                    double xr = er * gq[0] - ei * gq[1], xi = er * gq[1] + ei * gq[0];   /* e^{i phi} gq */
                    double pr = gp[0], pi = gp[1];
                    gp[0] = c * pr - sn * xr; gp[1] = c * pi - sn * xi;
                    gq[0] = sn * pr + c * xr; gq[1] = sn * pi + c * xi;
                }
                G[2 * ((size_t)p * n + q)] = G[2 * ((size_t)p * n + q) + 1] = 0;
                G[2 * ((size_t)q * n + p)] = G[2 * ((size_t)q * n + p) + 1] = 0;
                G[2 * ((size_t)p * n + p) + 1] = G[2 * ((size_t)q * n + q) + 1] = 0;
            }
    }
}

/* A truncating step at the bond between sites s-1 and s, site s the orthogonality center (sites
   left of it left-orthonormal, right of it right-orthonormal): with M = site s (dl x 2dr), the
   Schmidt values squared are the eigenvalues of M M^H; the bond keeps the eigenvectors U_k of the
   k largest (k <= kmax, and fewer while the dropped share stays <= cutoff): M <- U_k^H M, site
   s-1 <- site s-1 U_k, the orthogonal projection of the state on the kept Schmidt vectors (the
   best rank-k approximation). Then site s is made right-orthonormal (qk__mps_trunc_left, which
   drops nothing more). Returns the dropped share of the weight, sum of dropped / sum of all. */
static double qk__mps_trunc_svd(qk__mps_work *w, int s, int kmax)
{
    const int dl = w->dim[s], dr = w->dim[s + 1], d0 = w->dim[s - 1], n2 = 2 * dr;
    double *A = QK__SITE(w, s), *P = QK__SITE(w, s - 1), *G = w->X, *V = w->Q, *ev = w->beta, *M2 = w->V;
    int *idx = w->perm, p, q, c, k, t, l;
    double tot = 0, drop = 0;
    for (p = 0; p < dl; p++)   /* G = M M^H */
        for (q = p; q < dl; q++) {
            double gr = 0, gi = 0;
            for (c = 0; c < n2; c++) {
                double ar = A[2 * ((size_t)p * n2 + c)], ai = A[2 * ((size_t)p * n2 + c) + 1];
                double br = A[2 * ((size_t)q * n2 + c)], bi = A[2 * ((size_t)q * n2 + c) + 1];
                gr += ar * br + ai * bi;
                gi += ai * br - ar * bi;
            }
            G[2 * ((size_t)p * dl + q)] = gr; G[2 * ((size_t)p * dl + q) + 1] = gi;
            G[2 * ((size_t)q * dl + p)] = gr; G[2 * ((size_t)q * dl + p) + 1] = -gi;
        }
    qk__mps_jacobi(G, V, dl);
    for (p = 0; p < dl; p++) {   /* eigenvalues, largest first (insertion sort: dl <= 2 QK_MPS_MAX_BOND) */
        double v = G[2 * ((size_t)p * dl + p)];
        ev[p] = v > 0 ? v : 0;
        tot += ev[p];
        for (q = p; q > 0 && ev[idx[q - 1]] < v; q--) idx[q] = idx[q - 1];
        idx[q] = p;
    }
    k = dl < n2 ? dl : n2;
    if (kmax > 0 && kmax < k) k = kmax;
    for (t = k; t < dl; t++) drop += ev[idx[t]];
    while (k > 1 && w->cutoff > 0 && drop + ev[idx[k - 1]] <= w->cutoff * tot) drop += ev[idx[--k]];
    /* M2 = U_k^H M (k x 2dr), then site s <- M2 */
    for (t = 0; t < k; t++)
        for (c = 0; c < n2; c++) {
            double xr = 0, xi = 0;
            for (l = 0; l < dl; l++) {
                double ur = V[2 * ((size_t)l * dl + idx[t])], ui = V[2 * ((size_t)l * dl + idx[t]) + 1];
                double ar = A[2 * ((size_t)l * n2 + c)], ai = A[2 * ((size_t)l * n2 + c) + 1];
                xr += ur * ar + ui * ai;
                xi += ur * ai - ui * ar;
            }
            M2[2 * ((size_t)t * n2 + c)] = xr; M2[2 * ((size_t)t * n2 + c) + 1] = xi;
        }
    memcpy(A, M2, sizeof(double) * 2 * (size_t)k * (size_t)n2);
    /* site s-1 [(l', a)][l] <- sum_l P[(l', a)][l] U[l][t] */
    for (p = 0; p < 2 * d0; p++)
        for (t = 0; t < k; t++) {
            double xr = 0, xi = 0;
            for (l = 0; l < dl; l++) {
                double ur = V[2 * ((size_t)l * dl + idx[t])], ui = V[2 * ((size_t)l * dl + idx[t]) + 1];
                double ar = P[2 * ((size_t)p * dl + l)], ai = P[2 * ((size_t)p * dl + l) + 1];
                xr += ar * ur - ai * ui;
                xi += ar * ui + ai * ur;
            }
            w->tmp[2 * ((size_t)p * k + t)] = xr; w->tmp[2 * ((size_t)p * k + t) + 1] = xi;
        }
    memcpy(P, w->tmp, sizeof(double) * 2 * (size_t)(2 * d0) * (size_t)k);
    w->dim[s] = k;
    (void)qk__mps_trunc_left(w, s, k);
    return tot > 0 ? drop / tot : 0.0;
}

/* The sites lo..hi back to canonical form with every bond within its running bound: left-
   orthonormal up to hi by QR, then right to left by truncating pivoted QR (exact) or by the SVD
   step (truncation: each drop is a projection, recorded in angle and norm2); the center ends at lo.
   poll (may be NULL): a tick per site (a sweep may span the whole chain); on a cancel it stops
   half way (the build is discarded). */
static void qk__mps_compress(qk__mps_work *w, qk__poll *poll)
{
    int s;
    for (s = w->lo; s < w->hi; s++) {
        qk__mps_qr_right(w, s);
        if (poll && qk__poll_tick(poll, 8 * (int64_t)w->dim[s] * w->dim[s] * w->dim[s + 1])) return;
    }
    for (s = w->hi; s > w->lo; s--) {
        if (poll && qk__poll_tick(poll, 8 * (int64_t)w->dim[s] * w->dim[s + 1] * w->dim[s + 1])) return;
        if (w->trunc) {
            double wk = qk__mps_trunc_svd(w, s, w->bound[s]);
            if (wk > 0) {
                w->angle += asin(sqrt(wk < 1 ? wk : 1.0));
                w->norm2 *= 1 - wk;
            }
        } else {
            double d = qk__mps_trunc_left(w, s, w->bound[s]);
            if (d > w->discarded) w->discarded = d;
        }
    }
    w->hi = w->lo;
}

/* One sample's MPS into lane `lane` of group `out` (zero-filled beforehand). Returns eps, the
   bound on the infidelity 1 - |<psi|psi~>|^2 of the truncated (renormalised) state: the
   truncations are projections, each moving the state by the angle asin(sqrt(w_k)) at most, and
   the gates are unitary, so the angle to the exact state is at most theta = sum_k asin(sqrt(w_k))
   (the triangle inequality of the Fubini-Study distance) and eps = sin^2(min(theta, pi/2)).
   Exact builds return 0. poll (may be NULL): a tick per step, counting (2c)^3 flops per site a
   two-site gate or a compression sweeps (c: the largest bond it meets); on a cancel the build
   stops half way (the caller discards it). */
static double qk__mps_build1(const qk__mps_prog *p, const qk_map *m, const double *x, qk__mps_work *w, double *out, int lane,
                             qk__poll *poll)
{
    int q = p->q, s, k, b, l, a, r;
    double scale = 1.0;
    w->angle = 0;
    w->norm2 = 1;
    for (s = 0; s <= q; s++) { w->dim[s] = 1; w->bound[s] = 1; }
    for (s = 0; s < q; s++) { double *A = QK__SITE(w, s); A[0] = 1; A[1] = 0; A[2] = 0; A[3] = 0; }
    w->lo = w->hi = -1;
    qk_map_angles(m, x, w->theta);
    for (k = 0; k < p->n_steps; k++) {
        const qk__mps_step *st = &p->steps[k];
        int64_t work;
        if (st->kind == 1) {
            double U[8];
            if (qk__mps_u1(&m->ops[st->op], w->theta[st->op], x, U))
                qk__mps_apply1(QK__SITE(w, st->s0), w->dim[st->s0], w->dim[st->s0 + 1], U);
            work = 8 * (int64_t)w->dim[st->s0] * w->dim[st->s0 + 1];
        } else {
            double G[2][8];
            int over = 0, c = 1, sites = st->s1 - st->s0 + 1;
            qk__mps_g2(p, m, st, w->theta, G);
            qk__mps_apply2(w, st, G);
            if (w->lo < 0) { w->lo = st->s0; w->hi = st->s1; }
            else { if (st->s0 < w->lo) w->lo = st->s0; if (st->s1 > w->hi) w->hi = st->s1; }
            for (b = st->s0 + 1; b <= st->s1; b++) {
                w->bound[b] = p->bounds[st->b + (b - st->s0 - 1)];
                if (w->dim[b] > w->bound[b]) over = 1;
            }
            if (poll) {
                for (b = st->s0; b <= st->s1 + 1; b++) if (w->dim[b] > c) c = w->dim[b];
                if (over) sites += w->hi - w->lo + 1;
            }
            if (over) qk__mps_compress(w, poll);
            work = 8 * (int64_t)sites * c * c * c;
        }
        if (poll && qk__poll_tick(poll, work)) return 0.0;
    }
    if (w->trunc && w->norm2 > 0 && w->norm2 < 1) scale = 1.0 / sqrt(w->norm2);   /* renormalise (site 0) */
    for (s = 0; s < q; s++) {
        const double *A = QK__SITE(w, s);
        const double f = s == 0 ? scale : 1.0;
        int dl = w->dim[s], dr = w->dim[s + 1], Dr = p->D[s + 1];
        double *o = out + p->off[s] + lane;
        QK_ASSERT(dl <= p->D[s] && dr <= Dr);
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    size_t e = ((size_t)l * 2 + a) * Dr + r;
                    o[e * 2 * QK__NJ] = f * A[2 * (((size_t)l * 2 + a) * dr + r)];
                    o[e * 2 * QK__NJ + QK__NJ] = f * A[2 * (((size_t)l * 2 + a) * dr + r) + 1];
                }
    }
    if (w->angle <= 0) return 0.0;
    return w->angle >= 1.5707963267948966 ? 1.0 : sin(w->angle) * sin(w->angle);
}

/* Given MPS (qk_gram_mps_states): sample i of side (0: A, 1: B) into lane `lane` of group `out`
   (zero-filled beforehand), its bonds padded to the program's (the largest of every sample), every
   site times the sample's scale (1, or ||psi||^(-1/q) with normalize). The tensors were checked
   when the map was made (gram.c). */
static void qk__mps_given1(const qk__mps_prog *p, const qk__mpsmap *mm, int side, int64_t i, double *out, int lane)
{
    const qk_mps_states_desc *in = &mm->in;
    const int q = p->q, type = (int)in->type;
    const void *const *sites = (side ? in->b : in->a) + (size_t)i * (size_t)q;
    const int *bond = (side ? in->b_bonds : in->a_bonds) + (size_t)i * (size_t)(q + 1);
    const double f = mm->scale[(side ? in->n_a : 0) + i];
    int s, l, a, r;
    for (s = 0; s < q; s++) {
        const int dl = bond[s], dr = bond[s + 1], Dr = p->D[s + 1];
        double *o = out + p->off[s] + lane;
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    const int64_t k = in->layout == QK_MPS_LRP ? ((int64_t)l * dr + r) * 2 + a : ((int64_t)l * 2 + a) * dr + r;
                    const size_t e = ((size_t)l * 2 + a) * Dr + r;
                    double re, im;
                    qk__state_amp(sites[s], type, k, &re, &im);
                    o[e * 2 * QK__NJ] = f * re;
                    o[e * 2 * QK__NJ + QK__NJ] = f * im;
                }
    }
}

/* ---- states of many samples (lane layout), on the engine's threads ---- */
typedef struct qk__mps_build_job {
    const qk__mps_prog *p;
    const qk_map *m;
    const double *x;
    int64_t n, groups, next;
    double *out;
    double *eps;        /* NULL or n: per sample, qk__mps_build1's eps */
    int oom;
    double discarded[256];
    struct qk__gram_job *job;   /* NULL, or the job whose progress and cancel to poll */
} qk__mps_build_job;

static void qk__mps_build_work(void *arg, int thread)
{
    qk__mps_build_job *j = (qk__mps_build_job *)arg;
    qk__mps_work w;
    qk__poll poll;
    int64_t g;
    qk__poll_init(&poll, j->job, thread);
    if (j->p->given) memset(&w, 0, sizeof w);   /* packing needs no work space */
    else if (!qk__mps_work_init(&w, j->p, j->m)) { qk__mps_work_free(&w); QK__STORE(&j->oom, 1); return; }
    while ((g = QK__FETCH_ADD(&j->next, 1)) < j->groups) {
        int lane;
        size_t z;
        if (QK__LOAD(&j->oom)) break;
        /* its padding stays zero; zeroed in pieces, polled between (a group of a wide map of
           large bond is a GB) */
        for (z = 0; z < (size_t)j->p->group; z += (size_t)QK__POLL_WORK) {
            size_t c = (size_t)j->p->group - z < (size_t)QK__POLL_WORK ? (size_t)j->p->group - z : (size_t)QK__POLL_WORK;
            if (qk__poll_tick(&poll, (int64_t)c)) break;
            memset(j->out + g * j->p->group + z, 0, sizeof(double) * c);
        }
        if (z < (size_t)j->p->group) break;
        for (lane = 0; lane < QK__NJ && g * QK__NJ + lane < j->n; lane++) {
            double e;
            if (j->p->given) {   /* given MPS: packed; x says the side (qk__mpsmap.side) */
                const qk__mpsmap *mm = (const qk__mpsmap *)(const void *)j->m;
                qk__mps_given1(j->p, mm, j->x == (const double *)(const void *)&mm->side[1], g * QK__NJ + lane, j->out + g * j->p->group, lane);
                if (j->eps) j->eps[g * QK__NJ + lane] = 0.0;
                continue;
            }
            e = qk__mps_build1(j->p, j->m, j->x + (g * QK__NJ + lane) * j->m->n_features, &w, j->out + g * j->p->group, lane,
                                      j->job ? &poll : NULL);
            if (j->eps) j->eps[g * QK__NJ + lane] = e;
        }
    }
    if (thread < 256) j->discarded[thread] = w.discarded;
    qk__mps_work_free(&w);
}

/* The MPS of n samples in the lane layout (groups of QK__NJ, the last zero-padded); NULL with the
   error set when memory runs out. discarded (may be NULL): the largest norm a compression dropped;
   eps (may be NULL): n values, each sample's truncation bound (qk__mps_build1). job (may be
   NULL): the job polled meanwhile; where it cancels, the MPS are left half built. */
QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job)
{
    qk__mps_build_job j;
    double *out;
    int t;
    memset(&j, 0, sizeof j);
    j.groups = (n + QK__NJ - 1) / QK__NJ;
    if ((double)j.groups * (double)p->group * 8.0 > 9.0e18) { qk__set_error("mps: %lld states overflow", (long long)n); return NULL; }
    /* each group is zeroed by its builder (not here: ~0.5 s per GB on one thread, and no poll) */
    out = (double *)qk__malloc(sizeof(double) * (size_t)(j.groups * p->group));
    if (!out) {
        qk__set_error("mps: cannot allocate %.3g GB of host memory for %lld MPS", (double)j.groups * (double)p->group * 8e-9, (long long)n);
        return NULL;
    }
    j.p = p; j.m = m; j.x = x; j.n = n; j.out = out; j.eps = eps; j.job = job;
    if (n_threads > 256) n_threads = 256;
    QK_PROF_BEGIN("mps states");
    qk__parallel((int64_t)n_threads < j.groups ? n_threads : (int)j.groups, qk__mps_build_work, &j);
    QK_PROF_END("mps states");
    if (j.oom) { QK_FREE(out); qk__set_error("mps: out of host memory for the build work space"); return NULL; }
    if (discarded) {
        *discarded = 0;
        for (t = 0; t < 256; t++) if (j.discarded[t] > *discarded) *discarded = j.discarded[t];
    }
    return out;
}

/* ---- overlaps: a tile of K by transfer matrices ---- */
/* Per site, for one row sample (scalars A at stride 2 * QK__NJ, lane `lane`) against a group of
   QK__NJ column samples (vectors B): T = E B (vector x vector), E' = A^H T (scalar x vector).
   E: dl x dl, T: dl x 2dr, E': dr x dr vectors of [QK__NJ re | QK__NJ im]. */
#if defined(QK__VEC)
/* dr a multiple of 4 (every inner site of bond >= 4): the accumulators stay in registers, KB
   complex vectors of T over l', 4 of E' over (l, a). The 8 lanes go in slices of one hardware
   vector (W doubles: 8 with AVX-512, 4 with AVX2, 2 with SSE2), each slice over the whole sum, so
   2 KB + 4 vectors fit the registers (KB = 8 with AVX-512's 32, 4 with 16); each lane sums its
   terms in the same order whatever the slice, so the result depends only on FMA contraction (the
   instruction set: generic SSE2 has none). Where QK__DISPATCH, also compiled for AVX2 + FMA and
   AVX-512F, the job's qk__cpu_isa chooses (cpu_gram.c). Measured against the generic loop
   (qk__mps_site) and across builds: docs/benchmarks.md ("The MPS path's site kernel"). */
#define QK__MPS_SITE4_DEFINE(NAME, ATTR, VT, W, KB)                                                 \
    QK__CONTRACT ATTR static void NAME(const double *A, const double *B, int dl, int dr, const double *E, double *T, \
                                       double *En)                                                  \
    {                                                                                               \
        const int n2 = 2 * dr;                                                                      \
        int l, lp, k0, kk, la, r, r0, h;                                                            \
        VT z;                                                                                       \
        memset(&z, 0, sizeof z);                                                                    \
        for (l = 0; l < dl; l++)                                                                    \
            for (k0 = 0; k0 < n2; k0 += (KB))                                                       \
                for (h = 0; h < QK__NJ; h += (W)) {                                                 \
                    VT tr[KB], ti[KB];                                                              \
                    for (kk = 0; kk < (KB); kk++) { tr[kk] = z; ti[kk] = z; }                       \
                    for (lp = 0; lp < dl; lp++) {                                                   \
                        VT er, ei;                                                                  \
                        const double *bb = B + ((size_t)lp * n2 + k0) * 2 * QK__NJ + h;             \
                        const double *e = E + ((size_t)l * dl + lp) * 2 * QK__NJ + h;               \
                        memcpy(&er, e, sizeof er); memcpy(&ei, e + QK__NJ, sizeof ei);              \
                        for (kk = 0; kk < (KB); kk++) {                                             \
                            VT br, bi;                                                              \
                            memcpy(&br, bb + kk * 2 * QK__NJ, sizeof br);                           \
                            memcpy(&bi, bb + kk * 2 * QK__NJ + QK__NJ, sizeof bi);                  \
                            tr[kk] += er * br; tr[kk] -= ei * bi;                                   \
                            ti[kk] += er * bi; ti[kk] += ei * br;                                   \
                        }                                                                           \
                    }                                                                               \
                    for (kk = 0; kk < (KB); kk++) {   /* through whole vectors (QK__ST8 says why) */ \
                        double *t = T + ((size_t)l * n2 + k0 + kk) * 2 * QK__NJ + h;                \
                        VT sr = tr[kk], si = ti[kk];                                                \
                        memcpy(t, &sr, sizeof sr); memcpy(t + QK__NJ, &si, sizeof si);              \
                    }                                                                               \
                }                                                                                   \
        for (r = 0; r < dr; r++)                                                                    \
            for (r0 = 0; r0 < dr; r0 += 4)                                                          \
                for (h = 0; h < QK__NJ; h += (W)) {                                                 \
                    VT xr[4], xi[4];                                                                \
                    for (kk = 0; kk < 4; kk++) { xr[kk] = z; xi[kk] = z; }                          \
                    for (la = 0; la < 2 * dl; la++) {                                               \
                        const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ];                    \
                        const double ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];           \
                        const double *t = T + ((size_t)la * dr + r0) * 2 * QK__NJ + h;              \
                        for (kk = 0; kk < 4; kk++) {   /* += conj(c) t */                           \
                            VT vr, vi;                                                              \
                            memcpy(&vr, t + kk * 2 * QK__NJ, sizeof vr);                            \
                            memcpy(&vi, t + kk * 2 * QK__NJ + QK__NJ, sizeof vi);                   \
                            xr[kk] += cr * vr; xr[kk] += ci * vi;                                   \
                            xi[kk] += cr * vi; xi[kk] -= ci * vr;                                   \
                        }                                                                           \
                    }                                                                               \
                    for (kk = 0; kk < 4; kk++) {                                                    \
                        double *e = En + ((size_t)r * dr + r0 + kk) * 2 * QK__NJ + h;               \
                        VT sr = xr[kk], si = xi[kk];                                                \
                        memcpy(e, &sr, sizeof sr); memcpy(e + QK__NJ, &si, sizeof si);              \
                    }                                                                               \
                }                                                                                   \
    }

/* the build's own (qk__v4 / qk__v2: qk_internal.h), and where QK__DISPATCH, AVX2 + FMA and AVX-512F */
#if defined(__AVX512F__)
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v8, 8, 8)
#elif defined(__AVX__) || defined(__aarch64__)
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v4, 4, 4)
#else
QK__MPS_SITE4_DEFINE(qk__mps_site4_own, , qk__v2, 2, 4)
#endif
#if defined(QK__DISPATCH)
QK__MPS_SITE4_DEFINE(qk__mps_site4_avx2, __attribute__((target("avx2,fma"))), qk__v4, 4, 4)
QK__MPS_SITE4_DEFINE(qk__mps_site4_avx512, __attribute__((target("avx512f,fma"))), qk__v8, 8, 8)
#endif
#undef QK__MPS_SITE4_DEFINE

static void qk__mps_site4(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
#if defined(QK__DISPATCH)
    if (isa == QK__ISA_AVX512) { qk__mps_site4_avx512(A, B, dl, dr, E, T, En); return; }
    if (isa == QK__ISA_AVX2) { qk__mps_site4_avx2(A, B, dl, dr, E, T, En); return; }
#endif
    (void)isa;
    qk__mps_site4_own(A, B, dl, dr, E, T, En);
}

QK__CONTRACT
static void qk__mps_site(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
    const int n2 = 2 * dr;
    int l, lp, k, la, r, rp;
    qk__v8 z;
    if (dr % 4 == 0) { qk__mps_site4(isa, A, B, dl, dr, E, T, En); return; }
    memset(&z, 0, sizeof z);
    for (l = 0; l < dl; l++) {
        double *t = T + (size_t)l * n2 * 2 * QK__NJ;
        for (k = 0; k < n2; k++) { memcpy(t + k * 2 * QK__NJ, &z, sizeof z); memcpy(t + k * 2 * QK__NJ + QK__NJ, &z, sizeof z); }
        for (lp = 0; lp < dl; lp++) {
            qk__v8 er, ei;
            const double *bb = B + (size_t)lp * n2 * 2 * QK__NJ;
            QK__LD8(er, E + ((size_t)l * dl + lp) * 2 * QK__NJ);
            QK__LD8(ei, E + ((size_t)l * dl + lp) * 2 * QK__NJ + QK__NJ);
            for (k = 0; k < n2; k++) {
                qk__v8 br, bi, tr, ti;
                QK__LD8(br, bb + k * 2 * QK__NJ); QK__LD8(bi, bb + k * 2 * QK__NJ + QK__NJ);
                QK__LD8(tr, t + k * 2 * QK__NJ); QK__LD8(ti, t + k * 2 * QK__NJ + QK__NJ);
                tr += er * br; tr -= ei * bi;
                ti += er * bi; ti += ei * br;
                memcpy(t + k * 2 * QK__NJ, &tr, sizeof tr); memcpy(t + k * 2 * QK__NJ + QK__NJ, &ti, sizeof ti);
            }
        }
    }
    for (k = 0; k < dr * dr; k++) { memcpy(En + k * 2 * QK__NJ, &z, sizeof z); memcpy(En + k * 2 * QK__NJ + QK__NJ, &z, sizeof z); }
    for (la = 0; la < 2 * dl; la++)
        for (r = 0; r < dr; r++) {
            const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ], ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];
            const double *t = T + (size_t)la * dr * 2 * QK__NJ;
            double *e = En + (size_t)r * dr * 2 * QK__NJ;
            if (cr == 0 && ci == 0) continue;   /* padding */
            for (rp = 0; rp < dr; rp++) {  /* e += conj(c) t */
                qk__v8 tr, ti, xr, xi;
                QK__LD8(tr, t + rp * 2 * QK__NJ); QK__LD8(ti, t + rp * 2 * QK__NJ + QK__NJ);
                QK__LD8(xr, e + rp * 2 * QK__NJ); QK__LD8(xi, e + rp * 2 * QK__NJ + QK__NJ);
                xr += cr * tr; xr += ci * ti;
                xi += cr * ti; xi -= ci * tr;
                memcpy(e + rp * 2 * QK__NJ, &xr, sizeof xr); memcpy(e + rp * 2 * QK__NJ + QK__NJ, &xi, sizeof xi);
            }
        }
}
#else
static void qk__mps_site(int isa, const double *A, const double *B, int dl, int dr, const double *E, double *T, double *En)
{
    const int n2 = 2 * dr;
    int l, lp, k, la, r, rp, v;
    (void)isa;
    memset(T, 0, sizeof(double) * (size_t)dl * n2 * 2 * QK__NJ);
    for (l = 0; l < dl; l++)
        for (lp = 0; lp < dl; lp++) {
            const double *e = E + ((size_t)l * dl + lp) * 2 * QK__NJ, *bb = B + (size_t)lp * n2 * 2 * QK__NJ;
            double *t = T + (size_t)l * n2 * 2 * QK__NJ;
            for (k = 0; k < n2; k++)
                for (v = 0; v < QK__NJ; v++) {
                    double er = e[v], ei = e[QK__NJ + v], br = bb[k * 2 * QK__NJ + v], bi = bb[k * 2 * QK__NJ + QK__NJ + v];
                    t[k * 2 * QK__NJ + v] += er * br - ei * bi;
                    t[k * 2 * QK__NJ + QK__NJ + v] += er * bi + ei * br;
                }
        }
    memset(En, 0, sizeof(double) * (size_t)dr * dr * 2 * QK__NJ);
    for (la = 0; la < 2 * dl; la++)
        for (r = 0; r < dr; r++) {
            const double cr = A[((size_t)la * dr + r) * 2 * QK__NJ], ci = A[((size_t)la * dr + r) * 2 * QK__NJ + QK__NJ];
            const double *t = T + (size_t)la * dr * 2 * QK__NJ;
            double *e = En + (size_t)r * dr * 2 * QK__NJ;
            if (cr == 0 && ci == 0) continue;
            for (rp = 0; rp < dr; rp++)
                for (v = 0; v < QK__NJ; v++) {
                    double tr = t[rp * 2 * QK__NJ + v], ti = t[rp * 2 * QK__NJ + QK__NJ + v];
                    e[rp * 2 * QK__NJ + v] += cr * tr + ci * ti;
                    e[rp * 2 * QK__NJ + QK__NJ + v] += cr * ti - ci * tr;
                }
        }
}
#endif

/* Rows of a tile sharing each column group's site block (kept in L1 while they pass it). */
static int qk__mps_rows(const qk__mps_prog *p)
{
    int s, dmax = 1;
    for (s = 0; s <= p->q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    return dmax <= 8 ? 8 : dmax <= 16 ? 4 : 1;
}

/* Per-thread scratch (doubles) of qk__mps_tile. */
static size_t qk__mps_scratch(const qk__mps_prog *p)
{
    int s, dmax = 1;
    for (s = 0; s <= p->q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    return ((size_t)2 * qk__mps_rows(p) * dmax * dmax + (size_t)2 * dmax * dmax) * 2 * QK__NJ;
}

/* Work between two polls of the job's progress and cancel inside qk__mps_tile, counted per row
   as the sum over sites of dl dr (dl + dr) (1/128 of the flops of a row against a column group):
   a poll every site from bond 64 up, every few sites at small bonds. */
#define QK__MPS_POLL_WORK ((int64_t)1 << 18)

/* K of the tile rows [i0, i0+m) x cols [j0, j0+n) into kt (ld QK__T); j->A, j->B in the lane layout
   (j0 is a multiple of QK__T, so column groups are whole). Symmetric diagonal tiles skip the
   column groups wholly below the diagonal (qk__gram_work mirrors them). */
static void qk__mps_tile(const qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n, double *scratch, double *kt)
{
    const qk__mps_prog *p = (const qk__mps_prog *)j->mps;
    const int R = qk__mps_rows(p), q = p->q;
    const int diag = j->symmetric && i0 == j0;
    int dmax = 1, s, rr, v;
    int64_t cb, rb, work = 0;
    double *E0, *E1, *T;
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    E0 = scratch;
    E1 = E0 + (size_t)R * dmax * dmax * 2 * QK__NJ;
    T = E1 + (size_t)R * dmax * dmax * 2 * QK__NJ;
    for (cb = 0; cb < n; cb += QK__NJ) {
        const double *Bg = j->B + ((j0 + cb) / QK__NJ) * p->group;
        for (rb = 0; rb < m; rb += R) {
            const int nr = m - rb < R ? (int)(m - rb) : R;
            const size_t es = (size_t)dmax * dmax * 2 * QK__NJ;
            double *Ec = E0, *En = E1, *sw;
            if (diag && cb + QK__NJ - 1 < rb) continue;
            for (rr = 0; rr < nr; rr++) {   /* E = 1 */
                memset(Ec + rr * es, 0, sizeof(double) * 2 * QK__NJ);
                for (v = 0; v < QK__NJ; v++) Ec[rr * es + v] = 1.0;
            }
            for (s = 0; s < q; s++) {
                for (rr = 0; rr < nr; rr++) {
                    const int64_t i = i0 + rb + rr;
                    const double *A = j->A + (i / QK__NJ) * p->group + p->off[s] + (i % QK__NJ);
                    qk__mps_site(j->isa, A, Bg + p->off[s], p->D[s], p->D[s + 1], Ec + rr * es, T, En + rr * es);
                    if (rr == nr - 1) { sw = Ec; Ec = En; En = sw; }
                }
                /* a cancel inside the chain: a pair costs about 128 sum_s D_s D_s+1 (D_s + D_s+1)
                   flops, long for a wide map of a large bond (the tile is then left unfinished;
                   the job reports the cancel) */
                work += (int64_t)nr * p->D[s] * p->D[s + 1] * (p->D[s] + p->D[s + 1]);
                if (work >= QK__MPS_POLL_WORK) {
                    work = 0;
                    qk__job_poll((qk__gram_job *)j);
                    if (QK__LOAD(&j->cancel)) return;
                }
            }
            for (rr = 0; rr < nr; rr++)
                for (v = 0; v < QK__NJ && cb + v < n; v++) {
                    double re = Ec[rr * es + v], im = Ec[rr * es + QK__NJ + v];
                    kt[(rb + rr) * QK__T + cb + v] = re * re + im * im;
                }
        }
    }
}
#else /* QK_NO_MPS: the program analysis (mps_prog.c) stays; nothing builds or contracts an MPS */
static int qk__mps_rows(const qk__mps_prog *p) { (void)p; return 1; }
/* the GPU engine's MPS path (run_cuda.c) calls it, never planned here */
QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job)
{
    (void)p; (void)m; (void)x; (void)n; (void)n_threads; (void)discarded; (void)eps; (void)job;
    qk__set_error("mps: the MPS engine is compiled out (QK_NO_MPS)");
    return NULL;
}
#endif /* QK_NO_MPS */

/* ---- planning and running ---- */
/* Host memory (bytes) where the system says, else 0 (unknown). */
static double qk__host_ram(void)
{
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    if (pages > 0 && ps > 0) return (double)pages * (double)ps;
#endif
    return 0.0;
}

/* The MPS path's cost against the statevector's, per pair, in the CPU engine's measured time per
   flop: the blocked statevector Gram runs nearer the FMA peak than the transfer-matrix chain
   (short vectors, more loads per flop); 1.7 puts the switch between 10 and 11 qubits, where it was
   measured (docs/benchmarks.md, 'Figures behind the code's constants'). */
#ifndef QK__MPS_FLOP_RATIO
#define QK__MPS_FLOP_RATIO 1.7
#endif

/* QK__MPS_GPU_FLOP_RATIO: in qk_internal.h (the GPU planner uses it) */

/* The path choice for an entangled map, shared by the CPU and GPU planners: MPS when asked for,
   or (default) when the map is entangled, MPS-able and the statevector is impossible
   (q > QK_MAX_STATE_QUBITS, or sv_ok == 0: it does not fit), would not fit in half the memory
   (sv_big), or costs more per pair:
     statevector  8 * 2^q flops per pair (complex; real maps 2 * 2^q)
     MPS          ratio * sum_s 8 D_s D_{s+1} (D_s + D_{s+1})  (bonds capped at mps_max_bond)
   *use = 1: the MPS path, prog filled (the caller frees it); 0: the statevector, prog empty.
   Errors: a forced MPS on a product, dense or too-entangled map; a statevector beyond 30 qubits. */
QK__PRIV qk_result qk__mps_check_trunc(const qk_gram_desc *d)
{
    if (d->mps_max_bond < 0 || d->mps_max_bond > QK_MPS_MAX_BOND)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mps_max_bond must be 0 (exact) or 1..%d (QK_MPS_MAX_BOND), got %d",
                        QK_MPS_MAX_BOND, d->mps_max_bond);
    if (!(d->mps_cutoff >= 0.0 && d->mps_cutoff < 1.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mps_cutoff must be 0 (none) or in (0, 1), got %g", d->mps_cutoff);
    return QK_OK;
}

QK__PRIV qk_result qk__mps_decide(const qk_map *map, const qk_gram_desc *desc, double ratio, int sv_ok, int sv_big,
                                  qk__mps_prog *prog, int *use)
{
    const qk_path req = desc->path;
    const int q = map->n_qubits;
    qk_result r;
    int ok;
    *use = 0;
    memset(prog, 0, sizeof *prog);
    r = qk__mps_check_trunc(desc);
    if (r != QK_OK) return r;
    if ((int)req < (int)QK_PATH_DEFAULT || (int)req > (int)QK_PATH_MPS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown path %d", (int)req);
    if (map->cls == QK_CLASS_PRODUCT) {
        if (req == QK_PATH_MPS)
            return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: the map is a product state (no entangling op): it takes the analytic path");
        return QK_OK;
    }
    if (req != QK_PATH_DEFAULT && req != QK_PATH_MPS) {
        if (q > QK_MAX_STATE_QUBITS)
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "path statevector: %d qubits exceed the state limit %d (the MPS path takes local maps beyond it)", q, QK_MAX_STATE_QUBITS);
        return QK_OK;
    }
#ifdef QK_NO_MPS
    QK__UNUSED(ratio); QK__UNUSED(sv_ok); QK__UNUSED(sv_big); QK__UNUSED(ok);
    if (req == QK_PATH_MPS) return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: the MPS path is compiled out (QK_NO_MPS)");
    if (q > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%d qubits exceed the statevector limit %d, and the MPS path, which takes local maps "
                        "beyond it, is compiled out (QK_NO_MPS)", q, QK_MAX_STATE_QUBITS);
    return QK_OK;
#else
    r = qk__mps_prog_make_t(map, desc->mps_max_bond, desc->mps_cutoff, prog);
    if (r != QK_OK) return r;
    ok = !prog->dense && prog->chi <= QK_MPS_MAX_BOND;
    if (!ok) {
        char why[224];
        if (prog->dense) snprintf(why, sizeof why, "amplitude encoding makes a dense state (no MPS)");
        else snprintf(why, sizeof why, "its bond dimension bound reaches %s%d at bond %d (qubit order %s), beyond QK_MPS_MAX_BOND = %d: "
                      "the gates are not local enough (mps_max_bond truncates)", prog->chi >= QK__MPS_SAT ? ">= " : "", prog->chi, prog->chi_bond,
                      prog->folded ? "folded" : "natural", QK_MPS_MAX_BOND);
        qk__mps_prog_free(prog);
        if (req == QK_PATH_MPS) return qk__fail(QK_ERROR_UNSUPPORTED, "path mps: %s", why);
        if (q > QK_MAX_STATE_QUBITS)
            return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%d qubits exceed the statevector limit %d, and the MPS path cannot take this map: %s",
                            q, QK_MAX_STATE_QUBITS, why);
        return QK_OK;
    }
    if (req == QK_PATH_MPS || q > QK_MAX_STATE_QUBITS || !sv_ok || sv_big) *use = 1;
    else {
        const double sv = (map->cls == QK_CLASS_REAL ? 2.0 : 8.0) * ldexp(1.0, q);
        *use = ratio * prog->pair_flops < sv;
    }
    if (!*use) qk__mps_prog_free(prog);
    return QK_OK;
#endif /* QK_NO_MPS */
}

/* qk__mps_decide with the CPU engine's ratio (the statevector always possible, up to its limit):
   the path qk_gram's CPU plan takes, for the callers that build states themselves
   (qk_gram_projected). */
QK__PRIV qk_result qk__mps_decide_cpu(const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *prog, int *use)
{
    return qk__mps_decide(map, desc, QK__MPS_FLOP_RATIO, 1, 0, prog, use);
}

/* The plan's MPS fields from a program. */
static void qk__mps_plan_fields(const qk__mps_prog *prog, qk_plan *p)
{
    p->path = QK_PATH_MPS;
    p->mps_bond = prog->chi;
    p->mps_exact_bond = prog->exact_chi;
    p->mps_truncate = prog->max_bond > 0 || prog->cutoff > 0;
    p->mps_span = prog->span;
    p->mps_pair_flops = prog->pair_flops;
    p->mps_given = prog->given;
}

/* The CPU planner's path choice (qk__plan_cpu filled p for the map's own path): qk__mps_decide
   with the CPU's measured ratio, the statevector too big beyond half of the host memory. keep
   (may be NULL): an MPS plan's program is handed over there (the caller frees it) for the
   engine, which then does not build it again; untouched otherwise. */
QK__PRIV qk_result qk__mps_plan(const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep)
{
    qk__mps_prog prog;
    const double ram = qk__host_ram();
    int use = 0;
    qk_result r = qk__mps_decide(map, desc, QK__MPS_FLOP_RATIO, 1, ram > 0 && (double)p->bytes_states > 0.5 * ram, &prog, &use);
    if (r != QK_OK || !use) return r;
    {
        const int64_t gx = (desc->n_x + QK__NJ - 1) / QK__NJ, gy = desc->y ? (desc->n_y + QK__NJ - 1) / QK__NJ : 0;
        qk__mps_plan_fields(&prog, p);
        p->bytes_states = (size_t)((double)(gx + gy) * (double)prog.group * 8.0);
        p->bytes_total = p->bytes_states;
        snprintf(p->config, sizeof p->config, "mps %s, transfer matrices %d rows x %d lanes",
                 prog.given ? "given tensors (site s = qubit s)" : prog.folded ? "folded qubit order" : "natural qubit order", qk__mps_rows(&prog), QK__NJ);
    }
    if (keep) *keep = prog;
    else qk__mps_prog_free(&prog);
    return QK_OK;
}

/* The bond the GPU engine stores and contracts (qk_cuda.cu): 2 or 4 for its register kernel,
   else the bond itself (its warp kernel). */
QK__PRIV int qk__mps_gpu_chi(int chi) { return chi <= 2 ? 2 : chi <= 4 ? 4 : chi; }

/* Device bytes of one sample's MPS on the GPU engine: q sites of 2 chi^2 complex values. */
static double qk__mps_gpu_sample_bytes(int q, int chi, int d64)
{
    const int c = qk__mps_gpu_chi(chi);
    return (double)q * 2.0 * c * c * 2.0 * (d64 ? 8.0 : 4.0);
}


/* The job's fields of a GPU plan (both paths): output, sizes, symmetry, two streams. */
QK__PRIV void qk__plan_job_fields(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_dtype od, int64_t nx, int64_t ny, int sym)
{
    p->out_dtype = od;
    p->output = desc->output;
    p->n_qubits = map->n_qubits;
    p->n_x = nx;
    p->n_y = ny;
    p->symmetric = sym;
    p->n_streams = 2;
}
/* A zeroed CUDA plan with the job's fields. */
static void qk__plan_job(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_precision prec, qk_dtype od, int64_t nx,
                         int64_t ny, int sym)
{
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CUDA;
    p->precision = prec;
    qk__plan_job_fields(p, map, desc, od, nx, ny, sym);
}

/* The GPU plan of the MPS path (prog from qk__mps_decide). Device memory, all counted:
     MPS      (n_x + n_y) samples x q sites x 2 chi^2 complex, in the compute precision
     K        DEVICE output: the caller's; host outputs: all of K resident when K(X,X) fits beside
              the MPS (the pairs j >= i, mirrored), else a ring of two slabs of full rows
   Pinned host staging: one slab. Host memory while planning a run: the packed MPS in doubles
   (twice the fp32 device bytes) and the builder's lane layout. */
QK__PRIV qk_result qk__plan_cuda_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                     const qk_gram_desc *desc, const qk__mps_prog *prog, qk_plan *p)
{
    const int sym = desc->y == NULL;
    const int64_t nx = desc->n_x, ny = sym ? desc->n_x : desc->n_y;
    /* the default and auto: fp32 (the MPS kernels have no tensor-core mode), fp64 where tol asks
       for less than fp32's MPS bound; the stated bound is the one the MPS GPU suite holds:
       2e-6 + 5e-7 q chi in float, 1e-10 in double (plus float K's rounding) */
    const int autom = desc->precision == QK_PRECISION_DEFAULT || desc->precision == QK_PRECISION_AUTO;
    const double b32 = 2e-6 + 5e-7 * (double)prog->q * (double)prog->chi;
    const qk_precision prec = autom ? (desc->tol > 0.0 && desc->tol < b32 ? QK_PRECISION_FP64 : QK_PRECISION_FP32) : desc->precision;
    const int d64 = prec == QK_PRECISION_FP64 || prec == QK_PRECISION_FP32X3;
    const qk_dtype od = desc->out_dtype ? desc->out_dtype : (prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32);
    const double ob = od == QK_F64 ? 8.0 : 4.0;
    const double budget = (vram_fraction > 0 ? vram_fraction : 0.85) * (double)info->free_bytes;
    const int chi = qk__mps_gpu_chi(prog->chi);
    const double st = (double)(nx + (sym ? 0 : ny)) * qk__mps_gpu_sample_bytes(prog->q, prog->chi, d64);
    double kb = 0;
    int64_t slab, cap;
    qk__plan_job(p, map, desc, prec, od, nx, ny, sym);
    p->error_bound = d64 ? 1e-10 + (od == QK_F32 ? 1e-7 : 0.0) : b32;
    if (autom) {
        char g1[32], g2[32];
        p->tol = desc->tol > 0.0 ? desc->tol : b32;
        snprintf(p->precision_note, sizeof p->precision_note, "auto: %s, the MPS path's %s (bound %s, tol %s%s)",
                 qk_precision_name(prec), d64 ? "double kernels" : "float kernels", qk__fmt_g(g1, sizeof g1, p->error_bound, 2),
                 qk__fmt_g(g2, sizeof g2, p->tol, 2), desc->tol > 0.0 ? "" : ": default, fp32's MPS bound");
    }
    p->bulk_states = 1;
    p->tile_m = 8;
    p->tile_n = 32;
    p->bytes_budget = (size_t)budget;
    snprintf(p->device_name, sizeof p->device_name, "%s", info->name);
    qk__mps_plan_fields(prog, p);
    if (chi > 4) {
        const double smem = 3.0 * chi * chi * 2.0 * (d64 ? 8.0 : 4.0);
        if (info->smem_per_block_optin && smem > (double)info->smem_per_block_optin)
            return qk__fail(QK_ERROR_UNSUPPORTED, "path mps on the GPU: bond %d in %s needs %.0f bytes of shared memory per pair, the device allows %zu per block "
                            "(ask fp32, or mps_max_bond to truncate)", chi, d64 ? "fp64" : "fp32", smem, info->smem_per_block_optin);
    }
    /* slabs: ~64 MB of K, and at most ~25 ms of work (the register kernel at an estimated 10 T
       counted flops/s) so that progress and cancel come often; whole blocks of 32 rows */
    slab = (int64_t)(64.0 * 1048576.0 / ((double)ny * ob));
    cap = (int64_t)(25e-3 * 1e13 / (prog->pair_flops * (double)ny));
    if (slab > cap) slab = cap;
    slab = slab / 32 * 32;
    if (slab < 32) slab = 32;
    if (slab > nx) slab = nx;
    p->slab_rows = slab;
    if (desc->output == QK_OUTPUT_DEVICE) kb = 0;
    else {
        const double whole = (double)nx * (double)ny * ob;
        p->k_resident = sym && st + whole <= budget;
        kb = p->k_resident ? whole : 2.0 * (double)slab * (double)ny * ob;
        p->bytes_staging = (size_t)((double)slab * (double)ny * ob);
    }
    p->bytes_states = (size_t)st;
    p->bytes_out = (size_t)kb;
    p->bytes_total = (size_t)(st + kb);
    if (st + kb > budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: the MPS path needs %.3g GB of device memory (MPS %.3g GB, K %.3g GB), budget %.3g GB",
                        (st + kb) * 1e-9, st * 1e-9, kb * 1e-9, budget * 1e-9);
    if (chi <= 4)
        snprintf(p->config, sizeof p->config, "mps gpu %s order, register kernel chi %d, 8x32 pairs/block, %s%s",
                 prog->folded ? "folded" : "natural", chi, d64 ? "fp64" : "fp32",
                 prec != QK_PRECISION_FP64 && prec != QK_PRECISION_FP32 ? " (closest)" : "");
    else
        snprintf(p->config, sizeof p->config, "mps gpu %s order, warp per pair, chi %d, %s%s",
                 prog->folded ? "folded" : "natural", chi, d64 ? "fp64" : "fp32",
                 prec != QK_PRECISION_FP64 && prec != QK_PRECISION_FP32 ? " (closest)" : "");
    return QK_OK;
}

/* VRAM estimator of the MPS path: the largest n such that K(X,X) of n samples of `map` keeps its
   MPS resident on the device within half the budget (as qk_max_samples for statevectors), at the
   bond the map needs (max_bond > 0: capped). 0 when the map has no MPS. */
QKDEF int64_t qk_max_samples_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                 qk_precision precision, int max_bond)
{
    qk__mps_prog prog;
    double budget, per;
    int chi;
    if (!info || !info->present || !map || max_bond < 0 || max_bond > QK_MPS_MAX_BOND) return 0;
#ifdef QK_NO_MPS
    return 0;   /* no MPS path in this build */
#endif
    if (qk__mps_prog_make_t(map, max_bond, 0.0, &prog) != QK_OK) return 0;
    chi = prog.dense ? QK__MPS_SAT : prog.chi;
    qk__mps_prog_free(&prog);
    if (chi > QK_MPS_MAX_BOND) return 0;
    budget = (vram_fraction > 0 && vram_fraction <= 1 ? vram_fraction : 0.85) * (double)info->free_bytes;
    per = qk__mps_gpu_sample_bytes(map->n_qubits, chi, precision == QK_PRECISION_FP64 || precision == QK_PRECISION_FP32X3);
    return (int64_t)floor(0.5 * budget / per);
}

/* The MPS program of a plan on the MPS path: the planner's (planned, not NULL: qk_gram hands
   over the one it decided with) or, for a plan made elsewhere (tests, qk_plan_make's plan run
   later), built again from the map into *own (freed by the caller, zeroed when unused); *out
   points at the one to use. */
QK__PRIV qk_result qk__mps_prog_of(const qk__mps_prog *planned, const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *own,
                                 const qk__mps_prog **out)
{
    qk_result r;
    memset(own, 0, sizeof *own);
    *out = planned;
    if (planned && planned->q > 0) return QK_OK;
    r = qk__mps_prog_make_t(map, desc->mps_max_bond, desc->mps_cutoff, own);
    if (r != QK_OK) return r;
    if (own->dense || own->chi > QK_MPS_MAX_BOND) {
        qk__mps_prog_free(own);
        return qk__fail(QK_ERROR_UNSUPPORTED, "mps: the map is not MPS-able (plan made for another map?)");
    }
    *out = own;
    return QK_OK;
}

/* K on the MPS path (plan->path == QK_PATH_MPS, CPU engine) into the sink: the MPS of X (and Y),
   then the CPU engine's tiles with qk__mps_tile. planned: the planner's program (or NULL). */
QK__PRIV qk_result qk__mps_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *planned)
{
#ifdef QK_NO_MPS
    QK__UNUSED(plan); QK__UNUSED(map); QK__UNUSED(desc); QK__UNUSED(sink); QK__UNUSED(planned);
    (void)qk__mps_prog_of; (void)qk__mps_states;   /* the GPU engine's (run_cuda.c) */
    return qk__fail(QK_ERROR_UNSUPPORTED, "mps: the MPS path is compiled out (QK_NO_MPS)");
#else
    qk__mps_prog own;
    qk__gram_job j;
    double *A = NULL, *B = NULL;
    int nt = plan->n_threads > 0 ? plan->n_threads : 1;
    const qk__mps_prog *prog = NULL;
    qk_result r = qk__mps_prog_of(planned, map, desc, &own, &prog);
    if (r != QK_OK) return r;
    qk__cpu_job_init(&j, plan, desc, sink, NULL, NULL, prog->group, 0, prog, qk__mps_scratch(prog));
    j.mps_tile = qk__mps_tile;
    A = qk__mps_states(prog, map, desc->x, desc->n_x, nt, NULL, desc->mps_discarded, &j);
    if (A && desc->y && !j.cancel)
        B = qk__mps_states(prog, map, desc->y, desc->n_y, nt, NULL, desc->mps_discarded ? desc->mps_discarded + desc->n_x : NULL, &j);
    r = qk__cpu_gram_run(plan, desc, &j, A, B, sink);
    qk__cpu_job_free(&j);
    qk__free(A);
    qk__free(B);
    qk__mps_prog_free(&own);
    return r;
#endif
}
/* ---- end MPS engine ---- */

/* >>tune_impl ---- the autotune cache (JSON) ---- */
/* The file (docs/autotune.md):
     {"schema": 1, "qk": "0.1.0", "entries": [{"device": "...", "cc_major": 9, ...}, ...]}
   It is shared by processes and users' tools and may be damaged, truncated or written by someone
   else, so the reader is strict and bounded: the whole text must be valid JSON (grammar, UTF-8,
   escapes), at most QK_TUNE_CACHE_MAX_BYTES, nested at most QK__TJ_MAX_DEPTH deep, with the
   schema and every entry valid, before any entry is used. Unknown keys are skipped so that a
   later schema-1 writer may add fields. Numbers are written and read with '.' whatever the C
   locale says (a host program may have called setlocale).
   Only programs that can tune carry this code: it is compiled where the CUDA engine is
   (QK_CUDA) or with QK_TUNE_CACHE (tests, tools that manage the cache). A CPU-only build has
   qk_tune_key_init and stubs that return QK_ERROR_UNSUPPORTED (no JSON reader or writer), and
   so has any build with QK_NO_TUNE (the GPU planner then takes the fixed table). */
#if ((defined(QK_CUDA) && QK_CUDA) || defined(QK_TUNE_CACHE)) && !defined(QK_NO_TUNE)
#define QK__TUNE_ON 1
#else
#define QK__TUNE_ON 0
#endif
#ifndef QK_TUNE_CACHE_MAX_ENTRIES
#define QK_TUNE_CACHE_MAX_ENTRIES 4096  /* ~300 bytes each: about 1 MiB of typical file */
#endif
#ifndef QK_TUNE_CACHE_MAX_BYTES
#define QK_TUNE_CACHE_MAX_BYTES (8 << 20) /* above the largest file the writer can produce */
#endif

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

#if QK__TUNE_ON
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
#ifdef O_NOFOLLOW
#define QK__O_NOFOLLOW O_NOFOLLOW
#else
#define QK__O_NOFOLLOW 0
#endif
#endif

static const char *const qk__tune_path_names[] = {"?", "analytic", "real", "complex"};

/* A warning: to the log callback (if any) and to the detail message; returns r. */
static qk_result qk__tune_warn(qk_log_fn log, void *user, qk_result r, const char *fmt, ...) {
    char raw[1024], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    qk__esc_msg(msg, sizeof msg, raw);   /* a path with control bytes reaches the log as text */
    if (log) log(QK_LOG_WARN, msg, user);
    return qk__fail(r, "%s", msg);
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
    if ((int)in->precision < (int)QK_PRECISION_DEFAULT || (int)in->precision >= QK_PRECISION_COUNT)
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

/* Field names of an entry, in the order the writer writes them (QK__TF_* index them). */
static const char *const qk__tune_fields[] = {
    "device", "cc_major", "cc_minor", "driver", "qk", "kernel", "path", "precision", "qubits",
    "config", "metric", "timestamp"};
enum {
    QK__TF_DEVICE, QK__TF_CC_MAJOR, QK__TF_CC_MINOR, QK__TF_DRIVER, QK__TF_QK, QK__TF_KERNEL,
    QK__TF_PATH, QK__TF_PRECISION, QK__TF_QUBITS, QK__TF_CONFIG, QK__TF_METRIC, QK__TF_TIMESTAMP,
    QK__TUNE_NFIELDS
};

/* The string value of field f into *e. 0 on a syntax error; *ok = 0 when it breaks the schema
   (noted in j->sem_why). */
static int qk__tj_field_str(qk__tj *j, int index, int f, const char *name, qk_tune_entry *e, int *ok) {
    char sval[128];
    int fits, k;
    if (!qk__tj_str(j, sval, sizeof sval, &fits)) return 0;
    if (!fits) {
        qk__tj_sem(j, index, "string too long or holding NUL:", name);
        *ok = 0;
        return 1;
    }
    switch (f) {
    case QK__TF_DEVICE:
        qk__tune_copy(e->key.device, sizeof e->key.device, sval);
        break;
    case QK__TF_CONFIG:
        if (strlen(sval) >= sizeof e->config || !sval[0]) { qk__tj_sem(j, index, "bad length:", name); *ok = 0; }
        else qk__tune_copy(e->config, sizeof e->config, sval);
        break;
    case QK__TF_QK:
    case QK__TF_KERNEL: {
        char *dst = f == QK__TF_QK ? e->key.qk_version : e->key.kernel;
        size_t cap = f == QK__TF_QK ? sizeof e->key.qk_version : sizeof e->key.kernel;
        if (strlen(sval) >= cap) { qk__tj_sem(j, index, "too long:", name); *ok = 0; }
        else qk__tune_copy(dst, cap, sval);
        break;
    }
    case QK__TF_PATH:
        for (k = 1; k <= 3 && strcmp(sval, qk__tune_path_names[k]) != 0; k++) {}
        if (k > 3) { qk__tj_sem(j, index, "unknown path", sval); *ok = 0; }
        else e->key.path = (qk_path)k;
        break;
    default: /* QK__TF_PRECISION */
        for (k = 0; k < QK_PRECISION_COUNT && strcmp(sval, qk_precision_name((qk_precision)k)) != 0; k++) {}
        if (k >= QK_PRECISION_COUNT) { qk__tj_sem(j, index, "unknown precision", sval); *ok = 0; }
        else e->key.precision = (qk_precision)k;
        break;
    }
    return 1;
}

/* The number value of field f into *e (as qk__tj_field_str). */
static int qk__tj_field_num(qk__tj *j, int index, int f, const char *name, qk_tune_entry *e, int *ok) {
    double d = 0;
    int64_t iv = 0;
    int isi = 0;
    if (!qk__tj_num(j, &d, &iv, &isi)) return 0;
    if (f == QK__TF_METRIC) {
        if (!(d - d == 0.0)) { qk__tj_sem(j, index, "not finite:", name); *ok = 0; }
        e->metric = d;
    } else if (!isi) {
        qk__tj_sem(j, index, "not an integer:", name);
        *ok = 0;
    } else if (f == QK__TF_TIMESTAMP) {
        e->timestamp = iv;
    } else if (iv < -2147483647 - 1 || iv > 2147483647 ||
               (f == QK__TF_QUBITS && (iv < 1 || iv > QK_MAX_PRODUCT_QUBITS))) {
        qk__tj_sem(j, index, "out of range:", name);
        *ok = 0;
    } else if (f == QK__TF_CC_MAJOR) e->key.cc_major = (int)iv;
    else if (f == QK__TF_CC_MINOR) e->key.cc_minor = (int)iv;
    else if (f == QK__TF_DRIVER) e->key.driver_version = (int)iv;
    else e->key.n_qubits = (int)iv;
    return 1;
}

/* The value of member name (fits: the name was read whole) of entry index: a known field once
   and of its type, or an unknown key, skipped (a field of a later writer). 0 on a syntax error. */
static int qk__tj_field(qk__tj *j, int index, const char *name, int fits, unsigned *seen, qk_tune_entry *e,
                        int *ok) {
    int f, is_str;
    for (f = 0; fits && f < QK__TUNE_NFIELDS; f++)
        if (strcmp(name, qk__tune_fields[f]) == 0) break;
    qk__tj_ws(j);
    if (!fits || f == QK__TUNE_NFIELDS) return qk__tj_skip(j);
    is_str = f == QK__TF_DEVICE || f == QK__TF_QK || f == QK__TF_KERNEL || f == QK__TF_PATH ||
             f == QK__TF_PRECISION || f == QK__TF_CONFIG;
    if (*seen & (1u << f)) { qk__tj_sem(j, index, "duplicate field", name); *ok = 0; }
    *seen |= 1u << f;
    if (j->p < j->end && (is_str ? *j->p != '"' : !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))) {
        qk__tj_sem(j, index, is_str ? "not a string:" : "not a number:", name);
        *ok = 0;
        return qk__tj_skip(j);
    }
    return is_str ? qk__tj_field_str(j, index, f, name, e, ok) : qk__tj_field_num(j, index, f, name, e, ok);
}

/* One entry object (j->p at '{') into *e; *valid = 0 when it breaks the schema. 0 on a syntax
   error. */
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
        char name[16];
        int fits;
        if (!qk__tj_str(j, name, sizeof name, &fits) || !qk__tj_expect(j, ':', "expected ':'")) return 0;
        if (!qk__tj_field(j, index, name, fits, &seen, e, &ok)) return 0;
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

/* Appends *e to the entries (*v: n of cap, QK_MALLOC'ed); beyond QK_TUNE_CACHE_MAX_ENTRIES
   entries are dropped. 0 when out of memory. */
static int qk__tune_push(qk_tune_entry **v, int *n, int *cap, const qk_tune_entry *e) {
    if (*n >= QK_TUNE_CACHE_MAX_ENTRIES) return 1;
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        qk_tune_entry *nv;
        if (nc > QK_TUNE_CACHE_MAX_ENTRIES) nc = QK_TUNE_CACHE_MAX_ENTRIES;
        nv = (qk_tune_entry *)QK_MALLOC((size_t)nc * sizeof *nv);
        if (!nv) return 0;
        if (*n) memcpy(nv, *v, (size_t)*n * sizeof *nv);
        QK_FREE(*v);
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = *e;
    return 1;
}

/* The "entries" array (j->p at '['): every element validated, the valid entries appended.
   1; 0 on a syntax error; -1 when out of memory. */
static int qk__tj_entries(qk__tj *j, qk_tune_entry **v, int *n, int *cap) {
    qk_tune_entry e;
    int index = 0, valid;
    j->depth++;
    j->p++; /* '[' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == ']') j->p++;
    else for (;;) {
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == '{') {
            if (!qk__tj_entry(j, index, &e, &valid)) return 0;
            if (valid && !qk__tune_push(v, n, cap, &e)) return -1;
        } else {
            qk__tj_sem(j, -1, "not an object:", "entries[]");
            if (!qk__tj_skip(j)) return 0;
        }
        index++;
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == ']') { j->p++; break; }
        return qk__tj_err(j, "expected ',' or ']'");
    }
    j->depth--;
    return 1;
}

/* What the root object said about itself. */
typedef struct qk__tj_root {
    int have_schema, schema_int, have_entries;
    int64_t schema;
} qk__tj_root;

/* The root object's members (j->p at '{'): "schema", "entries" (into *v), others skipped.
   1; 0 on a syntax error; -1 when out of memory. */
static int qk__tj_root_members(qk__tj *j, qk__tj_root *rt, qk_tune_entry **v, int *n, int *cap) {
    j->depth = 1;
    j->p++; /* '{' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
    for (;;) {
        char name[16];
        int fits;
        if (!qk__tj_str(j, name, sizeof name, &fits) || !qk__tj_expect(j, ':', "expected ':'")) return 0;
        qk__tj_ws(j);
        if (fits && strcmp(name, "schema") == 0) {
            double d;
            if (rt->have_schema) qk__tj_sem(j, -1, "duplicate key", name);
            rt->have_schema = 1;
            if (j->p < j->end && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) {
                if (!qk__tj_num(j, &d, &rt->schema, &rt->schema_int)) return 0;
            } else if (!qk__tj_skip(j)) return 0;
        } else if (fits && strcmp(name, "entries") == 0) {
            if (rt->have_entries) qk__tj_sem(j, -1, "duplicate key", name);
            rt->have_entries = 1;
            if (j->p >= j->end || *j->p != '[') {
                qk__tj_sem(j, -1, "not an array:", name);
                if (!qk__tj_skip(j)) return 0;
            } else {
                int r = qk__tj_entries(j, v, n, cap);
                if (r <= 0) return r;
            }
        } else {
            if (fits && strcmp(name, "qk") == 0 && (j->p >= j->end || *j->p != '"'))
                qk__tj_sem(j, -1, "not a string:", name);
            if (!qk__tj_skip(j)) return 0;
        }
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
        return qk__tj_err(j, "expected ',' or '}'");
    }
}

/* The verdict on a whole file once read (not_object: its root is not an object): 1 when it is a
   cache of this schema with no error; else 0, and why says the first thing wrong, syntax first. */
static int qk__tj_verdict(const qk__tj *j, const qk__tj_root *rt, int not_object, char *why, size_t why_size) {
    if (j->bad) snprintf(why, why_size, "corrupt or truncated (%s)", j->why);
    else if (not_object) snprintf(why, why_size, "not a qk autotune cache (not a JSON object)");
    else if (!rt->have_schema) snprintf(why, why_size, "not a qk autotune cache (no \"schema\")");
    else if (!rt->schema_int) snprintf(why, why_size, "not a qk autotune cache (\"schema\" is not an integer)");
    else if (rt->schema > QK_TUNE_SCHEMA)
        snprintf(why, why_size, "written by a newer qk (schema %lld; this qk reads %d)", (long long)rt->schema, QK_TUNE_SCHEMA);
    else if (rt->schema != QK_TUNE_SCHEMA)
        snprintf(why, why_size, "unknown schema %lld (this qk reads %d)", (long long)rt->schema, QK_TUNE_SCHEMA);
    else if (!rt->have_entries) snprintf(why, why_size, "not a qk autotune cache (no \"entries\")");
    else if (j->sem) snprintf(why, why_size, "corrupt (%s)", j->sem_why);
    else return 1;
    return 0;
}

/* Parses a cache file's text (len bytes, no terminator needed). QK_OK: *out (QK_MALLOC'ed, NULL
   when *n_out is 0) holds the entries, at most QK_TUNE_CACHE_MAX_ENTRIES (later ones are
   validated and dropped). QK_ERROR_FORMAT: why says what is wrong (corrupt / not a qk cache /
   future schema). QK_ERROR_OUT_OF_MEMORY. */
static qk_result qk__tune_parse(const char *text, size_t len, qk_tune_entry **out, int *n_out,
                                char *why, size_t why_size) {
    qk__tj j;
    qk__tj_root rt;
    qk_tune_entry *v = NULL;
    int n = 0, cap = 0, not_object = 0, r = 1;
    *out = NULL;
    *n_out = 0;
    memset(&j, 0, sizeof j);
    memset(&rt, 0, sizeof rt);
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
        r = qk__tj_root_members(&j, &rt, &v, &n, &cap);
    }
    if (r < 0) {
        QK_FREE(v);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory");
    }
    if (!j.bad) {
        qk__tj_ws(&j);
        if (j.p != j.end) qk__tj_err(&j, "trailing characters");
    }
    if (!qk__tj_verdict(&j, &rt, not_object, why, why_size)) {
        QK_FREE(v);
        return QK_ERROR_FORMAT;
    }
    *out = v;
    *n_out = n;
    return QK_OK;
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
        qk__tb_s(b, ", \"precision\": "); qk__tb_str(b, qk_precision_name(e->key.precision));
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
/* What a path that is not a regular file is, for a warning. */
static const char *qk__tune_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
#ifdef S_ISBLK
    if (S_ISBLK(m)) return "a block device";
#endif
#ifdef S_ISSOCK
    if (S_ISSOCK(m)) return "a socket";
#endif
    return "a special file";
}

/* Reads the file at path. QK_OK: *text (QK_MALLOC'ed, *len bytes); QK_ERROR_IO with *err_no (a
   directory: EISDIR); QK_ERROR_FORMAT (too large, or not a regular file: why). Only a regular
   file is read: the path is stat()ed first (a device is never opened), then opened without
   blocking (a FIFO would block in open() until a writer comes, forever) and fstat()ed again.
   A symbolic link is followed (no O_NOFOLLOW): a cache file kept elsewhere and linked is read,
   and reading through a link writes nothing; a store replaces the link by a file (rename). */
static qk_result qk__tune_slurp(const char *path, char **text, size_t *len, int *err_no, char *why,
                                size_t why_size) {
    struct stat st;
    char *buf;
    size_t cap, n = 0;
    int fd;
    *text = NULL;
    *len = 0;
    *err_no = 0;
    if (stat(path, &st) != 0) { *err_no = errno; return QK_ERROR_IO; }
    if (S_ISDIR(st.st_mode)) { *err_no = EISDIR; return QK_ERROR_IO; }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "it is %s, not a regular file", qk__tune_kind(st.st_mode));
        return QK_ERROR_FORMAT;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | QK__O_CLOEXEC);
    if (fd < 0) { *err_no = errno; return QK_ERROR_IO; }
    if (fstat(fd, &st) != 0) { *err_no = errno; close(fd); return QK_ERROR_IO; }
    if (S_ISDIR(st.st_mode)) { *err_no = EISDIR; close(fd); return QK_ERROR_IO; }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, why_size, "it is %s, not a regular file", qk__tune_kind(st.st_mode));
        return QK_ERROR_FORMAT;
    }
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
                        k.kernel, qk__tune_path_names[k.path], qk_precision_name(k.precision), k.n_qubits,
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

QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    char pbuf[QK__TUNE_PATH_MAX], dir[QK__TUNE_PATH_MAX], lockp[QK__TUNE_PATH_MAX + 8], why[256];
    qk_tune_entry e, *v = NULL;
    qk__tbuf b;
    const char *slash;
    int n = 0, i, err_no, lfd, newest;
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
    /* The lock is opened as the file is read: without blocking (a FIFO), without following a
       symbolic link (O_CREAT would create its target anywhere), and used only when it is a
       regular file. */
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    lfd = open(lockp, O_RDWR | O_CREAT | O_NONBLOCK | O_NOCTTY | QK__O_NOFOLLOW | QK__O_CLOEXEC, 0666);
    if (lfd < 0 && errno == ELOOP)
        return qk__tune_warn(log, log_user, QK_ERROR_IO,
                             "autotune cache: cannot use %s: it is a symbolic link (remove it); no cache", lockp);
    if (lfd < 0)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot write %s: %s; no cache", lockp,
                             strerror(errno));
    {
        struct stat lst;
        if (fstat(lfd, &lst) != 0) {
            int e = errno;
            close(lfd);
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot use %s: %s; no cache",
                                 lockp, strerror(e));
        }
        if (!S_ISREG(lst.st_mode)) {
            close(lfd);
            return qk__tune_warn(log, log_user, QK_ERROR_IO,
                                 "autotune cache: cannot use %s: it is %s (remove it); no cache", lockp,
                                 qk__tune_kind(lst.st_mode));
        }
    }
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

    /* temporary file in the same directory, fsync, rename, fsync of the directory (npy section) */
    r = qk__write_file_atomic(path, b.p, b.len, NULL, 0);
    if (r == QK_ERROR_IO)
        r = qk__tune_warn(log, log_user, r, "autotune cache: %s; not updated", qk_last_error());
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
#else /* !QK__TUNE_ON: a CPU-only build, nothing to tune, or QK_NO_TUNE */
#ifdef QK_NO_TUNE
#define QK__TUNE_OFF_MSG "autotune cache: compiled out (QK_NO_TUNE; the GPU engine takes the fixed table)"
#else
#define QK__TUNE_OFF_MSG "autotune cache: not compiled in (a CPU-only build: define QK_CUDA=1 or QK_TUNE_CACHE)"
#endif
QKDEF qk_result qk_tune_cache_path(const char *dir_override, char *buf, size_t size) {
    (void)dir_override;
    if (buf && size) buf[0] = 0;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    (void)path; (void)key; (void)out; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    (void)path; (void)entry; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_choose(const qk_tune_request *req, char *config, size_t config_size,
                               char *label, size_t label_size) {
    (void)req; (void)config; (void)config_size; (void)label; (void)label_size;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
#endif /* QK__TUNE_ON */
/* ---- end autotune cache ---- */

/* >>planner ---- device info, planner, VRAM estimator ---- */
/* The GPU plan. Everything the CUDA engine (qk_cuda.cu) allocates is counted here:
     states      (n_x + n_y) x row bytes (bulk) or two state tiles
     scratch     per built state: its per-sample parameters (gate matrices and the dense
                 quadratic phase forms of qk_cuda.cu's program) and, for programs of more than
                 one pass (q > 13), a second state buffer
     K           host/callback output: all of K resident when it fits (symmetric slabs mirror
                 into later rows: half the pairs), else a ring of two slabs (full rows)
     workspace   cuBLAS path: one slab of <a|b> in complex (or real) T
   Staging (two pinned host slabs) is host memory, reported but not charged to the device.
   Engine choice: the fused SIMT kernel writes K once and wins where the job is write-bound (few
   qubits); cuBLAS runs the FP32 pipes near their peak and wins where it is compute-bound. So
   cuBLAS from QK__BLAS_MIN_QUBITS on (the measured crossover: docs/benchmarks.md, 'Figures behind the code's constants'). */
#define QK__BLAS_MIN_QUBITS 7

/* Tensor-core engines (plan.engine TC_*, qk_cuda.cu's qk__tc_products): the complex product in
   real form (Re <a|b> = a . b and Im <a|b> = a . rot(b) over the interleaved (re, im) rows, rot
   swapping each pair and negating one), real GEMMs over blocks of the upper triangle, the
   |.|^2 epilogue reading the Re and Im planes. Below QK__TC_MIN_QUBITS the Gram is bound by
   writing K, not by arithmetic, and the FP32 fused kernel (more accurate) is the faster one;
   at 6 qubits the tensor cores already win; at 4 qubits cuBLAS's C planes and the epilogue's
   second pass cost more than the arithmetic. FP32X3 sums hi*hi in chunks (a pass over C each),
   so it starts one qubit later (docs/benchmarks.md, 'Figures behind the code's constants'). */
#define QK__TC_MIN_QUBITS 6
static int qk__tc_min_qubits(qk_precision p) { return p == QK_PRECISION_FP32X3 ? QK__TC_MIN_QUBITS + 1 : QK__TC_MIN_QUBITS; }
/* ... on a device: fp32x3 of complex states from 5 qubits where the TMA-fed wgmma kernel runs
   (qk__k_wg3t): 1.3-2x the fused fp32 kernel (configuration 8) at 5 and 6 qubits, not faster at
   4 and below, where configuration 8 stays (docs/benchmarks.md, 'fp32x3 from 5 qubits') */
#define QK__TC_WG_MIN_QUBITS 5
static int qk__tc_min_qubits_on(qk_precision p, int wgmma, qk_path path)
{
    return p == QK_PRECISION_FP32X3 && wgmma && path == QK_PATH_COMPLEX ? QK__TC_WG_MIN_QUBITS : qk__tc_min_qubits(p);
}
#define QK__TC_WS_SHARE 0.45            /* share of the budget the tensor-core workspace may take */
/* The fused tensor-core kernel (plan.engine TCF_*, qk__engine_tcf_of the cuBLAS one) in the fixed
   table up to this many qubits, per mode: at 6 and 7 qubits it beats the cuBLAS engines in every
   mode (the Gram is short in k, so cuBLAS's C planes and the separate epilogue cost more than the
   MMAs), at 8 qubits only in FP16, from 9 qubits on cuBLAS wins (docs/benchmarks.md, 'Figures
   behind the code's constants'). Its configuration in the fixed table: 2 (64 x 64 tiles, 32 x 32
   per warp) up to 7 qubits, 1 (128 x 128, 64 x 32 per warp) at 8; the autotune still times both
   and cuBLAS per shape. On a device that runs wgmma (configuration 4), FP32X3 too up to 8 qubits:
   its TMA-fed persistent kernel for the triangle (qk__k_wg3t) is faster than cuBLAS + epilogue
   there (docs/benchmarks.md, 'fp32x3 through TMA, measured'). */
#define QK__TCF_MAX_QUBITS 7
#define QK__TCF_FP16_MAX_QUBITS 8
static int qk__tcf_max_qubits(qk_precision p, int wgmma)
{
    return p == QK_PRECISION_FP16 || (wgmma && p == QK_PRECISION_FP32X3) ? QK__TCF_FP16_MAX_QUBITS : QK__TCF_MAX_QUBITS;
}
/* the fixed table's configuration of the fused tensor-core kernel: 4 (wgmma) where the device
   runs it, FP16 and FP32X3 (docs/benchmarks.md, 'Figures behind the code's constants'); else 2 up
   to 7 qubits, 1 at 8 */
static int qk__tcf_fixed_cfg(int n_qubits, qk_precision p, int wgmma)
{
    if (wgmma && p != QK_PRECISION_TF32) return 4;
    return n_qubits <= 7 ? 2 : 1;
}
static qk_gpu_engine qk__tc_mode(qk_precision p) { return qk__tc_engine(p, 0); }
/* 1 when engine e is at least as accurate as precision p asks. FP32 plans keep their engines
   (FUSED, CUBLAS, CUBLAS_3M) only, so their results stay what they were. */
static int qk__blas_ok(qk_precision p, qk_path path, qk_gpu_engine e)
{
    if (e == QK_GPU_FUSED || e == QK_GPU_CUBLAS) return 1;
    if (p == QK_PRECISION_FP64) return e == QK_GPU_TC_FP64;
    if (e == QK_GPU_CUBLAS_3M) return path == QK_PATH_COMPLEX;
    if (qk__engine_tcf(e)) return qk__tc_mode(p) != QK_GPU_FUSED && e == qk__engine_tcf_of(qk__tc_mode(p));
    return e == qk__tc_mode(p) && p != QK_PRECISION_FP32;
}
/* Device bytes of one cuBLAS workspace slot (qk_cuda.cu's qk__blas_ws_bytes: keep the two in
   step): rows x cols inner products (complex two T, real one T) and, for the tensor-core
   engines, their operands in real form, W = 2^q (real) or 2^(q+1) (complex) values per state,
   for the rows, the columns and (complex) the rotated columns: TF32 one row of W floats, FP16
   and BF16 W halves, FP32X3 four blocks [hi lo hi hi] of W halves; FP64 real form the rotated
   columns only (W doubles). Complex states on the other tensor-core engines take Gauss's form
   (three planes of C; three operand planes of W / 2 values for the rows and for the columns,
   four when they are the same rows): the larger of the two is counted. */
static double qk__blas_ws(qk_gpu_engine e, int cplx, int q, double t, double rows, double cols)
{
    double W = ldexp(cplx ? 2.0 : 1.0, q), c = rows * cols * (cplx ? 2.0 : 1.0) * t, per, four, gauss, mx;
    if (!qk__engine_tc(e)) return c;
    if (e == QK_GPU_TC_FP64) return c + 512.0 + (cplx ? cols * W * 8.0 : 0.0);
    per = e == QK_GPU_TC_FP32X3 ? 8.0 * W : e == QK_GPU_TC_TF32 ? 4.0 * W : 2.0 * W;
    four = c + 512.0 + per * (rows + cols * (cplx ? 2.0 : 1.0));
    if (!cplx) return four;
    mx = rows > cols ? rows : cols;
    gauss = c * 1.5 + 512.0 + per / 2.0 * (4.0 * mx > 3.0 * (rows + cols) ? 4.0 * mx : 3.0 * (rows + cols));
    return gauss > four ? gauss : four;
}

/* Device bytes of the fused tensor-core engine's operands (plan.engine TCF_*, qk_cuda.cu's
   qk__tcf_geometry: keep the two in step) for `rows` states: 32-bit words per state, TF32 one per
   value, FP16 one per two values, FP32X3 two per two values (hi and lo), each part rounded up to
   whole k-stages (32 words; FP32X3 16). */
static double qk__tcf_ws(qk_gpu_engine eng, int cplx, int q, double rows)
{
    const double W = ldexp(cplx ? 2.0 : 1.0, q), kw = 32.0;   /* rows of whole 32-word stages (qk__tcf_geometry) */
    const double words = eng == QK_GPU_TCF_TF32 ? W : ceil(W / 2.0), ldp = ceil(words / kw) * kw;
    return rows * (eng == QK_GPU_TCF_FP32X3 ? 2.0 : 1.0) * ldp * 4.0 + 16.0;
}

/* The VRAM estimator: device bytes per sample of a q-qubit map on a path, in T of t bytes:
   *state, the state itself (analytic: its q qubit 2-vectors), and *scratch, its build scratch
   (params values of the compiled program, 1/||x||, the multi-pass state buffer beyond
   QK__PASS_QUBITS, the sample's n_features doubles on the device). qk__plan_cuda and
   qk_max_samples both count with it. */
static void qk__vram_per_state(int q, int n_features, double params, qk_path path, double t, double *state, double *scratch)
{
    double D = ldexp(1.0, q > 62 ? 62 : q);
    if (path == QK_PATH_ANALYTIC) { *state = 4.0 * q * t; *scratch = 0; return; }
    *state = D * t * (path == QK_PATH_REAL ? 1.0 : 2.0);
    *scratch = params * t + 8.0 /* 1/||x|| */ + (q > QK__PASS_QUBITS ? D * 2.0 * t : 0.0);
    *scratch += (double)n_features * 8.0; /* x on the device */
}

/* Device bytes per state of map m (qk__vram_per_state with its compiled program's params). */
static void qk__cuda_state_bytes(const qk_map *m, qk_path path, size_t t, double *state, double *scratch)
{
    qk__vram_per_state(m->n_qubits, m->n_features, (double)qk__cuda_params(m), path, (double)t, state, scratch);
    if (qk__map_is_states(m))   /* given states: loaded (no pass buffer); device states read in place */
        *scratch = (double)t + 8.0 + ((m->ops[0].q1 & QK__STATE_DEVICE) ? 0.0 : (double)m->n_features * 8.0);
}

/* ---- precision: stated error bounds and the AUTO choice ---- */
QKDEF double qk_precision_error_bound(qk_precision p, int n_qubits)
{
    const double q = n_qubits, u = ldexp(1.0, -11);
    double ep;
    if (n_qubits < 0 || n_qubits > 62) return -1.0;
    switch (p) {
    case QK_PRECISION_FP64: return 1e-10;
    case QK_PRECISION_FP32: ep = 0.0; break;
    case QK_PRECISION_TF32:
    case QK_PRECISION_FP16: ep = 2.0 * u + u * u; break;
    case QK_PRECISION_FP32X3: ep = 3.0 * ldexp(1.0, -22); break;
    default: return -1.0;
    }
    /* the operands' term (docs/precision.md): Gauss's product (the cuBLAS engines, complex
       states) carries e = e_p + 2^-23 (re - im and re + im rounded to fp32 first) on
       Re (<= e) and Im (<= 3e), so |delta| <= sqrt(10) e */
    if (ep > 0.0) ep += ldexp(1.0, -23);
    return 1e-4 * (1.0 + q / 4.0) + ldexp(1.0, n_qubits - 24) / 4.0 + 1e-4 + (ep > 0.0 ? 2.0 * sqrt(10.0) * ep + 10.0 * ep * ep : 0.0);
}

/* Speed order of the GPU modes (docs/precision.md: fp16 > tf32 > fp32x3 > fp32 > fp64 wherever
   the tensor cores apply). A tensor-core mode
   is a candidate only where it runs on the tensor cores (qk__tc_min_qubits .. QK__TC_MAX_QUBITS,
   not the analytic path); elsewhere it would run the fp32 engine, which AUTO then names as is. */
/* The default tolerance of AUTO (tol 0): fp32-class, fp32x3's bound (fp32's plus the hi/lo
   split's operand term, 5.3e-6; its measured error is fp32's, docs/precision.md), so from 7
   qubits the default runs fp32x3 on the tensor cores; product maps (the analytic path: no sum of
   2^q products, no tensor cores) keep fp32's bound without its drift term. */
static double qk__default_tol(int n_qubits, qk_path path)
{
    const int q = n_qubits > 62 ? 62 : n_qubits;
    return path == QK_PATH_ANALYTIC ? qk_precision_error_bound(QK_PRECISION_FP32, q) - ldexp(1.0, q - 24) / 4.0
                                    : qk_precision_error_bound(QK_PRECISION_FP32X3, q);
}

QK__PRIV qk_precision qk__auto_precision(const qk_map *map, qk_path path, double tol, int wgmma, char *note, size_t size)
{
    static const qk_precision order[5] = {QK_PRECISION_FP16, QK_PRECISION_TF32, QK_PRECISION_FP32X3, QK_PRECISION_FP32,
                                          QK_PRECISION_FP64};
    /* product maps (the analytic path) multiply q per-qubit overlaps: no sum of 2^q products, so
       fp32's bound there drops the drift term */
    const int q = map->n_qubits > 62 ? 62 : map->n_qubits, an = path == QK_PATH_ANALYTIC;
    const double drift = ldexp(1.0, q - 24) / 4.0;
    const double t = tol > 0.0 ? tol : qk__default_tol(map->n_qubits, path);
    char g1[32], g2[32];
    int i;
    for (i = 0; i < 5; i++) {
        const qk_precision m = order[i];
        const int tc = m == QK_PRECISION_FP16 || m == QK_PRECISION_TF32 || m == QK_PRECISION_FP32X3;
        const double b = qk_precision_error_bound(m, q) - (an && m == QK_PRECISION_FP32 ? drift : 0.0);
        if (tc && (path == QK_PATH_ANALYTIC || map->n_qubits < qk__tc_min_qubits_on(m, wgmma, path) || map->n_qubits > 24)) continue;
        if (b > t) continue;
        if (note) /* numbers with a '.' whatever the locale (the plan text is locale-free) */
            snprintf(note, size, "auto: %s, the fastest mode whose error bound %s meets tol %s%s (%d qubits)", qk_precision_name(m),
                     qk__fmt_g(g1, sizeof g1, b, 2), qk__fmt_g(g2, sizeof g2, t, 2), tol > 0.0 ? "" : an ? " (default: fp32's bound)" : " (default: fp32-class, fp32x3's bound)",
                     map->n_qubits);
        return m;
    }
    if (note)
        snprintf(note, size, "auto: fp64: no mode's error bound meets tol %s (fp64's is %s)", qk__fmt_g(g1, sizeof g1, t, 2),
                 qk__fmt_g(g2, sizeof g2, qk_precision_error_bound(QK_PRECISION_FP64, q), 2));
    return QK_PRECISION_FP64;
}

/* CPU plan: all states in host memory when they fit the host budget, else state tiles. */
#ifndef QK_CPU_SLAB_BYTES
#define QK_CPU_SLAB_BYTES ((size_t)128 << 20)   /* host bytes per streamed slab (two are used) */
#endif
#define QK__CPU_SLAB_BYTES ((size_t)(QK_CPU_SLAB_BYTES))
#define QK__HOST_SHARE 0.85     /* share of the available host memory the CPU engine plans with */

/* Available host memory in bytes, 0 when unknown: Linux's MemAvailable (free memory and the
   page cache the kernel can drop), bounded by the cgroup v2 limit (memory.max - memory.current)
   where the process runs in one (containers, batch jobs); elsewhere sysconf's available pages. */
static double qk__host_avail(void)
{
    double avail = 0.0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (double)kb * 1024.0; break; }
        fclose(f);
    }
    if (avail > 0) {
        unsigned long long mx = 0, cur = 0;
        int ok = 0;
        f = fopen("/sys/fs/cgroup/memory.max", "r");   /* "max" (no limit) does not scan */
        if (f) { ok = fscanf(f, "%llu", &mx) == 1; fclose(f); }
        f = ok ? fopen("/sys/fs/cgroup/memory.current", "r") : NULL;
        if (f) {
            if (fscanf(f, "%llu", &cur) == 1 && mx > cur && (double)(mx - cur) < avail) avail = (double)(mx - cur);
            fclose(f);
        }
        return avail;
    }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    {
        long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
        if (pages > 0 && ps > 0) return (double)pages * (double)ps;
    }
#endif
    return 0.0;
}

/* Host bytes of the CPU engine's per-thread scratch: the Gram tile buffers of qk__gram_work
   (and a callback tile) and the state builders' angles and, real path, imaginary half. */
static double qk__cpu_scratch(const qk_map *map, qk_path path, double es, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + es * QK__T * QK__T;
    double build = 8.0 * (map->n_ops + 1) + (path == QK_PATH_REAL ? 8.0 * ldexp(1.0, map->n_qubits) : 0.0);
    return (double)(nt > 0 ? nt : 1) * (tile + build);
}

/* The same for qk_max_samples: a complex map of q qubits and a few hundred ops, float64 K. */
static double qk__cpu_scratch_q(int q, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + 8.0 * QK__T * QK__T;
    return (double)(nt > 0 ? nt : 1) * (tile + 8.0 * (20.0 * q + 2.0 * (1 + q + q * q) + 1));
}

#if !defined(_WIN32)
#include <sys/resource.h>
#endif
/* The address space and data segment the process may still map under its resource limits
   (ulimit -v, ulimit -d; batch systems set them): RLIMIT_AS less the current virtual size, and
   RLIMIT_DATA less the current data and stack size (/proc/self/statm, conservatively: its data
   field counts the stack too), the smaller where both are finite; at least 1 byte once a limit
   is reached. -1: no finite limit (or no getrlimit). Where statm cannot be read, the limit
   itself is the room. */
static double qk__rlimit_room(void)
{
    double room = -1.0;
#if !defined(_WIN32) && (defined(RLIMIT_AS) || defined(RLIMIT_DATA))
    struct rlimit rl;
    double vm = 0.0, data = 0.0, page = 4096.0;
    FILE *f;
#if defined(_SC_PAGESIZE)
    {
        long ps = sysconf(_SC_PAGESIZE);
        if (ps > 0) page = (double)ps;
    }
#endif
    f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long long sz, res, sh, txt, lib, dat;
        if (fscanf(f, "%llu %llu %llu %llu %llu %llu", &sz, &res, &sh, &txt, &lib, &dat) == 6) {
            vm = (double)sz * page;
            data = (double)dat * page;
        }
        fclose(f);
    }
#ifdef RLIMIT_AS
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) room = (double)rl.rlim_cur - vm;
#endif
#ifdef RLIMIT_DATA
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (room < 0.0 || (double)rl.rlim_cur - data < room))
        room = (double)rl.rlim_cur - data;
#endif
    if (room != -1.0 && room < 1.0) room = 1.0;
#endif
    return room;
}

/* The host budget of a CPU plan (bytes), and the available memory it came from (0: given). The
   available memory is qk__host_avail's, bounded by what the resource limits leave
   (qk__rlimit_room): under ulimit -v the states are tiled as under a cgroup's limit. */
static double qk__host_budget(const qk_device_info *info, double *avail)
{
    double room;
    *avail = 0.0;
    if (info && info->host_budget_bytes) return (double)info->host_budget_bytes;
    *avail = qk__host_avail();
    room = qk__rlimit_room();
    if (room > 0.0 && (*avail <= 0.0 || room < *avail)) *avail = room;
    return QK__HOST_SHARE * *avail;
}

/* nt: the engine's threads (their scratch is counted). keep (may be NULL): an MPS plan's program
   for the engine (qk__mps_plan). */
QK__PRIV qk_result qk__plan_cpu_nt(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, int nt, qk_plan *p,
                                   qk__mps_prog *keep)
{
    qk_path path = qk__path_of(map);
    const int64_t nb = desc->y ? desc->n_y : desc->n_x;
    double avail, budget, row, es, all, scratch, staging = 0.0;
    qk_result r;
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CPU;
    p->path = path;
    p->precision = QK_PRECISION_FP64;
    p->out_dtype = desc->out_dtype ? desc->out_dtype : (qk__prec_f32(desc->precision) ? QK_F32 : QK_F64);
    p->output = desc->output;
    p->n_qubits = map->n_qubits;
    p->n_x = desc->n_x;
    p->n_y = nb;
    p->symmetric = desc->y == NULL;
    p->n_threads = nt > 0 ? nt : 1;
    p->bulk_states = 1;
    p->state_tile = 0;
    p->tile_m = p->tile_n = QK__T;
    p->n_streams = 0;
    p->linear = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_MIXED) != 0;
    es = p->out_dtype == QK_F32 ? 4.0 : 8.0;
    p->bytes_states = map->n_qubits > QK_MAX_STATE_QUBITS && path != QK_PATH_ANALYTIC ? (size_t)-1 /* no statevector */
                      : (size_t)((double)(desc->n_x + (desc->y ? desc->n_y : 0)) * (double)qk__row_len(map, path) * 8.0);
    p->bytes_out = (size_t)((double)desc->n_x * (double)nb * es);
    p->bytes_total = p->bytes_states;
    if (desc->output == QK_OUTPUT_NPY) {
        /* two slab buffers of at most cpu_slab_bytes (QK_CPU_SLAB_BYTES) each, whole tiles of
           rows: host memory O(slab), not O(n^2); the symmetric mirror goes out as one write per
           row and slab, so taller slabs mean fewer, larger writes */
        double rb = (double)nb * es;
        size_t slab_bytes = desc->cpu_slab_bytes ? desc->cpu_slab_bytes : QK__CPU_SLAB_BYTES;
        int64_t sr = (int64_t)((double)slab_bytes / rb) / QK__T * QK__T;
        if (sr < QK__T) sr = QK__T;
        if (sr > desc->n_x) sr = (desc->n_x + QK__T - 1) / QK__T * QK__T;
        p->slab_rows = sr;
        p->bytes_staging = (size_t)(2.0 * (double)sr * rb);
        staging = (double)p->bytes_staging + (double)sr * 64.0 * es; /* and the strips' buffer */
    }
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d; fp64 arithmetic (asked %s: the CPU engine computes in fp64)",
                 QK__T, QK__T, QK__NI, QK__NJ, qk_precision_name(desc->precision));
    else snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d", QK__T, QK__T, QK__NI, QK__NJ);
    p->error_bound = qk_precision_error_bound(QK_PRECISION_FP64, map->n_qubits);
    p->tol = desc->precision == QK_PRECISION_AUTO ? desc->tol : 0.0;
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->precision_note, sizeof p->precision_note, "fp64 (asked %s: the CPU engine accepts every mode and computes in fp64%s)",
                 qk_precision_name(desc->precision), desc->precision == QK_PRECISION_AUTO ? ", which meets any tolerance" : "");
    snprintf(p->device_name, sizeof p->device_name, "CPU");
    budget = qk__host_budget(info, &avail);
    p->bytes_budget = (size_t)budget;
    p->bytes_host_avail = (size_t)avail;
    r = qk__mps_plan(map, desc, p, keep);   /* MPS engine: statevector or MPS */
    if (r != QK_OK || p->path == QK_PATH_MPS) return r;

    /* statevector and analytic paths: all states resident when they fit the host budget with
       the scratch and the streamed output's slabs; else state tiles, two blocks of R samples
       (R a multiple of the tile side from QK__T on), and the streamed output's slabs one row
       block each. An unknown budget (no /proc/meminfo, no sysconf) plans all resident. */
    row = (double)qk__row_len(map, path) * 8.0;
    all = (double)p->bytes_states;
    scratch = qk__cpu_scratch(map, path, es, p->n_threads);
    p->bytes_workspace = (size_t)scratch;
    p->bytes_total = (size_t)(all + scratch + (double)p->bytes_staging);
    if (budget <= 0 || all + scratch + staging <= budget) return QK_OK;
    {
        const double per = 2.0 * row + (desc->output == QK_OUTPUT_NPY ? 2.0 * (double)nb * es + 64.0 * es : 0.0);
        const int64_t most = desc->n_x > nb ? desc->n_x : nb;
        double fit;
        /* fewer threads where their scratch leaves no room for two states (a small budget on a
           host of many cores): each thread's scratch is its own */
        while (p->n_threads > 1 && (budget - scratch) / per < 1.0) {
            p->n_threads = (p->n_threads + 1) / 2;
            scratch = qk__cpu_scratch(map, path, es, p->n_threads);
            p->bytes_workspace = (size_t)scratch;
        }
        fit = (budget - scratch) / per;
        int64_t R = fit >= (double)most ? most : fit >= 1.0 ? (int64_t)fit : 0;
        if (R < 1)
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "plan: two %d-qubit states need %.0f bytes of host memory (%.3g GB, with %.0f bytes "
                            "of scratch for %d threads), the host budget is %.0f bytes (%.3g GB%s)", map->n_qubits,
                            per + scratch, (per + scratch) * 1e-9, scratch, p->n_threads, budget, budget * 1e-9,
                            avail > 0 ? ": 85% of the available memory" : ": qk_ctx_desc.host_memory");
        if (R > QK__T) R = R / QK__T * QK__T;
        p->bulk_states = 0;
        p->state_tile = R;
        p->tile_m = p->tile_n = R < QK__T ? R : QK__T;
        p->bytes_states = (size_t)(2.0 * (double)R * row);
        if (desc->output == QK_OUTPUT_NPY) {
            p->slab_rows = R;
            p->bytes_staging = (size_t)(2.0 * (double)R * (double)nb * es);
        }
        p->bytes_total = (size_t)((double)p->bytes_states + scratch + (double)p->bytes_staging);
    }
    return QK_OK;
}

static qk_result qk__plan_cpu(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep)
{
    return qk__plan_cpu_nt(info, map, desc, qk__ncores(), p, keep);
}



static qk_result qk__plan_cuda(const qk_device_info *info, double vram_fraction, const qk_map *map,
                               const qk_gram_desc *desc, qk_plan *p)
{
    const qk_path path = qk__path_of(map);
    const int sym = desc->y == NULL;
    const int64_t nx = desc->n_x, ny = sym ? desc->n_x : desc->n_y;
    char note[128] = "";
    /* density matrices (qk_gram_states, a_mixed / b_mixed): K = a . b itself (plan.linear), on the
       cuBLAS real engine, whose epilogue keeps the inner product unsquared (docs/states.md) */
    const int linear = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_MIXED) != 0;
    /* (the wgmma kernel's few-qubit fp32x3 squares: not for the linear epilogue) */
    const qk_precision prec = desc->precision && desc->precision != QK_PRECISION_AUTO
                                  ? desc->precision : qk__auto_precision(map, path, desc->tol, info->wgmma && !linear, note, sizeof note);
    const size_t t = prec == QK_PRECISION_FP64 ? 8 : 4;
    const qk_dtype od = desc->out_dtype ? desc->out_dtype : (prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32);
    const double ob = od == QK_F64 ? 8.0 : 4.0;
    const double budget = (vram_fraction > 0 ? vram_fraction : 0.85) * (double)info->free_bytes;
    double st, sc, es, need;
    int64_t slab, tile;
    int tc_fallback = 0, slab_tile = 0;
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CUDA;
    p->linear = linear;
    p->path = path;
    p->precision = prec;
    {   /* the analytic path has no sum of 2^q products: fp32's bound without the drift term */
        const double drift = path == QK_PATH_ANALYTIC ? ldexp(1.0, (map->n_qubits > 62 ? 62 : map->n_qubits) - 24) / 4.0 : 0.0;
        p->error_bound = qk_precision_error_bound(prec, map->n_qubits > 62 ? 62 : map->n_qubits) - (prec == QK_PRECISION_FP64 ? 0.0 : drift);
        p->tol = desc->precision == QK_PRECISION_AUTO || desc->precision == QK_PRECISION_DEFAULT
                     ? (desc->tol > 0.0 ? desc->tol : qk__default_tol(map->n_qubits, path))
                     : 0.0;
    }
    snprintf(p->precision_note, sizeof p->precision_note, "%s", note);
    qk__plan_job_fields(p, map, desc, od, nx, ny, sym);
    p->bytes_budget = (size_t)budget;
    snprintf(p->device_name, sizeof p->device_name, "%s", info->name);
    if (path != QK_PATH_ANALYTIC && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "plan: %d qubits exceed the state limit %d", map->n_qubits, QK_MAX_STATE_QUBITS);
    qk__cuda_state_bytes(map, path, t, &st, &sc);
    p->engine = path != QK_PATH_ANALYTIC && map->n_qubits >= QK__BLAS_MIN_QUBITS ? QK_GPU_CUBLAS : QK_GPU_FUSED;
    if (linear) {
        /* the cuBLAS real engine, or its tensor-core form (the real Gram of the vectorised
           matrices, one GEMM a block: qk__tc_products) where the mode runs on the tensor cores;
           never the fused kernels, whose epilogues square */
        p->engine = qk__tc_mode(prec) && map->n_qubits >= qk__tc_min_qubits(prec) && map->n_qubits <= QK__TC_MAX_QUBITS
                        ? qk__tc_mode(prec) : QK_GPU_CUBLAS;
        if (qk__tc_mode(prec) && p->engine == QK_GPU_CUBLAS) tc_fallback = map->n_qubits > QK__TC_MAX_QUBITS ? 2 : 3;
    } else if (qk__tc_mode(prec) && path != QK_PATH_ANALYTIC) {
        p->engine = map->n_qubits < qk__tc_min_qubits_on(prec, info->wgmma, path) ? QK_GPU_FUSED
                    : map->n_qubits <= QK__TC_MAX_QUBITS ? qk__tc_mode(prec) : QK_GPU_CUBLAS;
        if (p->engine == QK_GPU_CUBLAS) tc_fallback = 2;
    }
    es = (path == QK_PATH_COMPLEX ? 2.0 : 1.0) * (double)t; /* one <a|b> in the cuBLAS workspace */

    /* states: bulk when all of them (and their scratch) take at most half the budget */
    need = (double)(nx + (sym ? 0 : ny)) * st + (double)(nx > ny ? nx : ny) * sc;
    if (qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && !sym)   /* both sides' rows on the device */
        need += (double)(nx < ny ? nx : ny) * (double)map->n_features * 8.0;
    if (need <= 0.5 * budget) {
        p->bulk_states = 1;
        p->state_tile = 0;
        tile = nx > ny ? nx : ny;
        p->bytes_states = (size_t)need;
    } else {
        /* two tiles (A and B) with scratch in half the budget, a power of two. Given host states
           (the data are the states, copied in by tile): a slab of K is a whole tile of rows, so
           that the column tiles cross PCIe once per tile of rows, n + n^2 / 2R rows for K(A,A),
           not once per slab; the ring of two such slabs of K is then counted with the tiles
           (unless even 64 rows of it do not fit: then slabs as for maps) */
        double ring = qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && desc->output != QK_OUTPUT_DEVICE
                          ? 2.0 * (double)ny * ob : 0.0;
        if (64.0 * (2.0 * st + sc + ring) > 0.5 * budget) ring = 0.0;
        slab_tile = ring > 0.0;
        tile = 1;
        while (tile * 2 <= (nx > ny ? nx : ny) && (double)(tile * 2) * (2.0 * st + sc + ring) <= 0.5 * budget) tile *= 2;
        if ((double)tile * (2.0 * st + sc) > 0.5 * budget)
            return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: one %d-qubit state (%.3g GB with scratch) exceeds the device budget %.3g GB",
                            map->n_qubits, (2.0 * st + sc) * 1e-9, budget * 1e-9);
        p->bulk_states = 0;
        p->state_tile = tile;
        p->bytes_states = (size_t)((double)tile * (2.0 * st + sc));
    }

    /* slabs: rows of K per step. Device output: one step (the fused kernel) or as many rows as
       a quarter of the budget holds in cuBLAS workspace. Host outputs: ~64 MB of K per slab, so
       the D2H of one overlaps the compute of the next and the host-side delivery of the one
       before; small pinned staging slabs keep
       the cost of pinning them small (docs/benchmarks.md, 'Figures behind the code's constants'). */
    if (desc->output == QK_OUTPUT_DEVICE) {
        /* one slab: slabbing K for device output bought nothing (docs/benchmarks.md, 'Figures behind the code's constants') */
        slab = nx;
    } else {
        slab = (int64_t)(64.0 * 1048576.0 / ((double)ny * ob));
        /* and at most ~25 ms of compute per slab (FP32 cores at ~50 TFLOP/s, 8 D flops per
           complex pair, 2 D per real pair), so that a cancel (progress callback, Ctrl-C in
           Python, SIGINT in qk-gram) lands within a few slabs (docs/benchmarks.md, 'Figures behind the code's constants') */
        if (path != QK_PATH_ANALYTIC) {
            double per_pair = (path == QK_PATH_COMPLEX ? 8.0 : 2.0) * ldexp(1.0, map->n_qubits > 62 ? 62 : map->n_qubits);
            double cap = 25e-3 * 50e12 / (per_pair * (double)ny);
            if ((double)slab > cap) slab = (int64_t)cap;
        }
        if (slab < 64) slab = 64;
        if (slab > nx) slab = nx;
    }
    if (!p->bulk_states && (slab > tile || slab_tile)) slab = tile;
    if (qk__engine_tc(p->engine)) {
        /* tensor-core operands: as many rows as fit QK__TC_WS_SHARE of the budget (a ring of two
           slots when there are several slabs); when even 64 rows do not (the columns' operands
           alone), the fp32 cuBLAS engine, more accurate and without operand copies */
        const int cx = path == QK_PATH_COMPLEX, q = map->n_qubits;
        int64_t cols = p->bulk_states ? ny : tile, s2 = slab;
        /* (given host states in tiles keep slabs of a whole tile: a smaller slab would fetch
           the column tiles again for each slab, so the fp32 cuBLAS engine runs instead) */
        while (!slab_tile && s2 > 64 && (s2 < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)s2, (double)cols) > QK__TC_WS_SHARE * budget)
            s2 = (s2 + 1) / 2;
        if ((s2 < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)s2, (double)cols) > QK__TC_WS_SHARE * budget) {
            tc_fallback = 1;
            p->engine = QK_GPU_CUBLAS;
        } else {
            slab = s2;
            p->bytes_workspace = (size_t)((slab < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)slab, (double)cols));
        }
    }
    if (!linear && qk__engine_tcf_of(p->engine) != QK_GPU_FUSED && map->n_qubits <= qk__tcf_max_qubits(p->precision, info->wgmma)) {
        /* the fused tensor-core kernel (fixed table; the autotune times both): its operands, every
           state once (bulk) or two state tiles, must fit where the cuBLAS engine's did; the larger
           of the two workspaces is counted, so the autotune may pick either */
        const double fw = qk__tcf_ws(qk__engine_tcf_of(p->engine), path == QK_PATH_COMPLEX, map->n_qubits,
                                     p->bulk_states ? (double)(nx + (sym ? 0 : ny)) : 2.0 * (double)tile);
        if (fw <= QK__TC_WS_SHARE * budget) {
            p->engine = qk__engine_tcf_of(p->engine);
            p->kernel_cfg = qk__tcf_fixed_cfg(map->n_qubits, prec, info->wgmma);
            if (fw > (double)p->bytes_workspace) p->bytes_workspace = (size_t)fw;
        }
    }
    if (p->engine == QK_GPU_CUBLAS || p->engine == QK_GPU_CUBLAS_3M) {
        int64_t cols = p->bulk_states ? ny : tile;
        while (slab > 64 && !slab_tile && 2.0 * (double)slab * (double)cols * es > 0.25 * budget) slab = (slab + 1) / 2;
        p->bytes_workspace = (size_t)((slab < nx ? 2.0 : 1.0) * (double)slab * (double)cols * es);
    }
    p->tile_m = slab;
    p->tile_n = p->bulk_states ? ny : tile;
    p->slab_rows = desc->output == QK_OUTPUT_DEVICE ? 0 : slab;

    /* K on the device (host/callback outputs) */
    if (desc->output != QK_OUTPUT_DEVICE) {
        double left = budget - (double)p->bytes_states - (double)p->bytes_workspace;
        double full = (double)nx * (double)ny * ob;
        p->k_resident = full <= left;
        p->bytes_out = (size_t)(p->k_resident ? full : 2.0 * (double)slab * (double)ny * ob);
        p->bytes_staging = (size_t)(2.0 * (double)slab * (double)ny * ob);
    }
    p->bytes_total = p->bytes_states + p->bytes_out + p->bytes_workspace;
    p->use_blas = (int)p->engine;   /* the deprecated mirror */
    if (!qk__blas_ok(prec, path, p->engine)) /* the engine is never less accurate than asked */
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "plan: engine %s does not serve precision %s", qk__engine_name(p->engine), qk_precision_name(prec));
    if ((double)p->bytes_total > budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: needs %.3g GB of device memory, budget %.3g GB",
                        (double)p->bytes_total * 1e-9, budget * 1e-9);
    if (path == QK_PATH_ANALYTIC) snprintf(p->config, sizeof p->config, "analytic 64x64 t4x4 (fixed table)");
    else if (linear && qk__engine_tc(p->engine))
        snprintf(p->config, sizeof p->config, "cublas %s tensor cores, real form, %s, linear epilogue: Tr(rho_i rho_j)",
                 qk_precision_name(prec), sym ? "triangle blocks" : "gemm");
    else if (linear) {   /* (at most 95 characters: "...) (fp32x3: no tensor cores, < 7 qubits)") */
        char why[24] = "workspace";
        if (tc_fallback == 3) snprintf(why, sizeof why, "< %d qubits", qk__tc_min_qubits(prec));
        if (tc_fallback == 2) snprintf(why, sizeof why, "> %d qubits", QK__TC_MAX_QUBITS);
        /* the precisions bound so that GCC's -Wformat-truncation (-O1, -Os) sees the 96 bytes suffice */
        snprintf(p->config, sizeof p->config, "cublas %s %s, linear epilogue: Tr(rho_i rho_j)%s%.7s%s%.11s%s",
                 prec == QK_PRECISION_FP64 ? "fp64" : "fp32", sym ? "syrk+gemm" : "gemm", tc_fallback ? " (" : "",
                 tc_fallback ? qk_precision_name(prec) : "", tc_fallback ? ": no tensor cores, " : "", tc_fallback ? why : "",
                 tc_fallback ? ")" : "");
    }
    else if (qk__engine_tcf(p->engine))
        snprintf(p->config, sizeof p->config, "fused %s tensor cores (%s) %s, |.|^2 in the epilogue (fixed table)",
                 qk_precision_name(prec), p->kernel_cfg == 4 ? "wgmma" : "mma.sync",
                 p->kernel_cfg == 4 ? (prec == QK_PRECISION_FP32X3 ? "128x64" : "128x128")
                 : prec == QK_PRECISION_FP32X3 || p->kernel_cfg == 2 ? "64x64 w32x32" : "128x128 w64x32");
    else if (qk__engine_tc(p->engine))
        snprintf(p->config, sizeof p->config, "cublas %s tensor cores, real form, %s + |.|^2 epilogue (fixed table)",
                 qk_precision_name(prec), sym ? "triangle blocks" : "gemm");
    else if (tc_fallback)
        snprintf(p->config, sizeof p->config, "cublas fp32 %s (%s %s) (fixed table)", sym ? "herk/syrk+gemm" : "gemm",
                 qk_precision_name(prec), tc_fallback == 2 ? "tensor cores: at most 24 qubits" : "operands exceed the budget");
    else if (p->engine != QK_GPU_FUSED) snprintf(p->config, sizeof p->config, "cublas %s + |.|^2 epilogue (fixed table)", sym ? "herk/syrk+gemm" : "gemm");
    else if (qk__tc_mode(prec) && path != QK_PATH_ANALYTIC)
        snprintf(p->config, sizeof p->config, "fused %s fp32 (%s: tensor cores do not pay below %d qubits) (fixed table)",
                 qk__fused_cfg_name(qk__fused_cfg_fixed(map->n_qubits, 0, path != QK_PATH_REAL, od == QK_F32)),
                 qk_precision_name(prec), qk__tc_min_qubits_on(prec, info->wgmma, path));
    else snprintf(p->config, sizeof p->config, "fused %s (fixed table)",
                  qk__fused_cfg_name(qk__fused_cfg_fixed(map->n_qubits, prec == QK_PRECISION_FP64, path != QK_PATH_REAL, od == QK_F32)));
    p->kernel_cfg = qk__plan_cfg_runs(p, p->engine, p->kernel_cfg);   /* the fixed table's configuration, named */
    return QK_OK;
}

static qk_result qk__plan_for_device(const qk_device_info *info, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);

/* A plan's device fields for one device (or the CPU engine: n_devices 0). */
static void qk__plan_one_device(qk_plan *p, int ordinal)
{
    memset(p->devices, 0, sizeof p->devices);
    memset(p->dev_row0, 0, sizeof p->dev_row0);
    memset(p->dev_pairs, 0, sizeof p->dev_pairs);
    p->n_devices = p->backend == QK_BACKEND_CUDA ? 1 : 0;
    p->devices[0] = ordinal;
    p->dev_row0[1] = p->n_x;
    p->dev_pairs[0] = p->symmetric ? p->n_x * (p->n_x + 1) / 2 : p->n_x * p->n_y;
    p->dev_imbalance = 1.0;
    p->dev_full_rows = 0;
    p->n_parts = 0;
}

QKDEF qk_result qk_plan_for_device(const qk_device_info *info, double vram_fraction,
                                   const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    qk_result r = qk__plan_for_device(info, vram_fraction, map, desc, out, NULL);
    if (r == QK_OK) qk__plan_one_device(out, 0);
    return r;
}

#ifndef QK_MGPU_MIN_PAIRS
#define QK_MGPU_MIN_PAIRS ((int64_t)1 << 25)
#endif
/* Full rows (qk_plan.dev_full_rows) below this many flops per byte of K: a GPU does ~50e12
   flops/s (FP32 cores), a host thread transposes and writes ~5e9 bytes/s, so the mirror costs
   more than recomputing when a pair's flops / its bytes < 1e4. */
#define QK__MGPU_FULL_ROWS_FLOPS 1e4
#ifndef QK_MGPU_HOST_BOUND_SPLIT
#define QK_MGPU_HOST_BOUND_SPLIT 0
#endif

/* A rectangle whose mirror its GPU delivers to the host (qk_cuda_io.mirror_out / mrows): one
   slab's transpose more on the device, and each staging slot holds a slab and its transpose.
   Where the transposed slab leaves the budget, K stops being resident (the ring of two slabs);
   a plan that still does not fit fails as any other. */
static qk_result qk__plan_mirror_slab(qk_plan *sp)
{
    const double ob = sp->out_dtype == QK_F64 ? 8.0 : 4.0, slab = (double)sp->slab_rows * (double)sp->n_y * ob;
    if (sp->k_resident && (double)sp->bytes_total + slab > (double)sp->bytes_budget) {
        sp->bytes_total -= sp->bytes_out;
        sp->bytes_out = (size_t)(2.0 * slab);
        sp->bytes_total += sp->bytes_out;
        sp->k_resident = 0;
    }
    sp->bytes_out += (size_t)slab;
    sp->bytes_total += (size_t)slab;
    sp->bytes_staging = (size_t)(4.0 * slab);
    if (sp->bytes_total > sp->bytes_budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: needs %.3g GB of device memory with the transpose of a slab of the "
                        "rectangle's mirror, budget %.3g GB", (double)sp->bytes_total * 1e-9, (double)sp->bytes_budget * 1e-9);
    return QK_OK;
}

/* qk_plan_for_devices; keep (may be NULL): an MPS plan's program for the engine (the caller frees
   it; zeroed when the plan is not on the MPS path). */
QK__PRIV qk_result qk__plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                      const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    qk_schedule_desc sd;
    qk_schedule sch;
    double w[QK_MAX_DEVICES];
    int k, use, same = 1, full;
    int64_t total, minp;
    int split;
    qk_result r;
    if (!infos || !map || !desc || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: NULL argument");
    /* the tunables: the desc's, else the macros' (qk_gram_desc.mgpu_min_pairs, mgpu_host_bound_split) */
    minp = desc->mgpu_min_pairs > 0 ? desc->mgpu_min_pairs : (int64_t)(QK_MGPU_MIN_PAIRS);
    if (minp < 1) minp = 1;
    split = desc->mgpu_host_bound_split ? desc->mgpu_host_bound_split > 0 : (QK_MGPU_HOST_BOUND_SPLIT) != 0;
#if defined(QK_CUDA) && QK_CUDA
    /* a page-locked HOST buffer takes each GPU's rows straight over its own link (no host copy):
       a host-bound K(X,X) is dealt out unless the desc says -1 (docs/api.md, "Several GPUs") */
    if (desc->mgpu_host_bound_split == 0 && desc->output == QK_OUTPUT_HOST && desc->out && qk_cuda_host_pinned(desc->out)) split = 1;
#endif
    if (n < 1 || n > QK_MAX_DEVICES) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: n must be in [1, %d] (got %d)", QK_MAX_DEVICES, n);
    for (k = 0; k < n; k++) {
        int j;
        if (!infos[k].present) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: infos[%d] is not a present device", k);
        if (ordinals && ordinals[k] < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: ordinals[%d] = %d", k, ordinals[k]);
        for (j = 0; ordinals && j < k; j++)
            if (ordinals[j] == ordinals[k]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: CUDA device %d is listed twice", ordinals[k]);
    }
    r = qk__plan_for_device(&infos[0], vram_fraction, map, desc, out, keep);
    if (r != QK_OK) return r;
    qk__plan_one_device(out, 0);
    if (out->backend != QK_BACKEND_CUDA) { out->n_devices = 0; return QK_OK; }   /* the CPU engine */
    out->devices[0] = ordinals ? ordinals[0] : 0;
    if (out->path == QK_PATH_MPS) return QK_OK;   /* the MPS path runs on the first GPU alone */
    total = out->dev_pairs[0];
    full = desc->y == NULL && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY) &&
           (out->path == QK_PATH_ANALYTIC ? 0.0 : (out->path == QK_PATH_COMPLEX ? 8.0 : 2.0) * ldexp(1.0, out->n_qubits)) <
           QK__MGPU_FULL_ROWS_FLOPS * (out->out_dtype == QK_F64 ? 8.0 : 4.0);
    for (use = n; use > 1 && total / use < minp; use--) {}
    if (use < 2 || (full && !split)) return QK_OK;   /* the host binds: one GPU */
    for (k = 0; k < use; k++) {
        w[k] = infos[k].sm_count > 0 ? (double)infos[k].sm_count : 1.0;
        if (w[k] != w[0]) same = 0;
    }
    memset(&sd, 0, sizeof sd);
    sd.n_x = desc->n_x;
    sd.n_y = desc->y ? desc->n_y : full ? desc->n_x : 0;
    sd.n_workers = use;
    sd.weights = same ? NULL : w;
    r = qk_schedule_make(&sd, &sch);
    if (r != QK_OK) return r;
    out->n_devices = use;
    out->dev_full_rows = full;
    for (k = 0; k < use; k++) {
        out->devices[k] = ordinals ? ordinals[k] : k;
        out->dev_row0[k] = sch.row0[k];
        out->dev_pairs[k] = sch.pairs[k];
    }
    out->dev_row0[use] = sch.row0[use];
    out->dev_imbalance = sch.imbalance;
    qk_schedule_free(&sch);
    /* every GPU's parts, each planned for that GPU (the engine runs these plans) */
    for (k = 0; k < use; k++) {
        int64_t part[2][3];
        const int np = qk__mgpu_parts(out, k, part);
        qk_map pm;
        qk_op pop;
        int i;
        for (i = 0; i < np; i++) {
            qk_plan_part *pp = &out->parts[out->n_parts];
            qk_gram_desc sd;
            qk_plan sp;
            memset(pp, 0, sizeof *pp);
            pp->device = k;
            pp->symmetric = (int)part[i][2];
            pp->mirror = out->symmetric && !pp->symmetric && !out->dev_full_rows;
            pp->row0 = out->dev_row0[k];
            pp->n_rows = out->dev_row0[k + 1] - out->dev_row0[k];
            pp->col0 = part[i][0];
            pp->n_cols = part[i][1] - part[i][0];
            qk__mgpu_part_desc(out, pp, map->n_features, desc, &sd);
            r = qk__plan_for_device(&infos[k], vram_fraction, qk__map_for_device(map, k, &pm, &pop), &sd, &sp, NULL);
            if (r == QK_OK && pp->mirror && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY)) r = qk__plan_mirror_slab(&sp);
            if (r == QK_OK) qk__plan_one_device(&sp, 0);
            if (r == QK_OK) r = qk__plan_part_set(out, out->n_parts, &sp, infos[k].name);
            if (r != QK_OK) {
                char why[sizeof qk__errbuf];
                snprintf(why, sizeof why, "%s", qk_last_error());
                return qk__fail(r, "CUDA device %d: its part of K (rows [%lld, %lld), columns [%lld, %lld)): %s", out->devices[k],
                                (long long)pp->row0, (long long)(pp->row0 + pp->n_rows), (long long)pp->col0,
                                (long long)(pp->col0 + pp->n_cols), why);
            }
            out->n_parts++;
        }
    }
    return qk__mgpu_check_parts(out);   /* what the engine accepts (it checks again: a plan may be put together by hand) */
}

QKDEF qk_result qk_plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__plan_for_devices(infos, ordinals, n, vram_fraction, map, desc, out, NULL);
}

/* The map GPU k of a plan of several devices plans and runs its parts with: the map itself, but
   for device states (QK__STATE_DEVICE, which live on the first GPU) on any other GPU, a copy
   (*tmp, its op *op) marked QK__STATE_PEER instead: that GPU copies the rows in from the first
   GPU's memory by tile as it would host states (and the planner counts the raw rows' buffer),
   where the first GPU reads them in place. */
QK__PRIV const qk_map *qk__map_for_device(const qk_map *map, int k, qk_map *tmp, qk_op *op)
{
    if (k == 0 || !qk__map_is_states(map) || !(map->ops[0].q1 & QK__STATE_DEVICE)) return map;
    *tmp = *map;
    *op = map->ops[0];
    op->q1 = (op->q1 & ~QK__STATE_DEVICE) | QK__STATE_PEER;
    tmp->ops = op;
    return tmp;
}

/* Device k's parts of K in a plan of several devices: rows [dev_row0[k], dev_row0[k + 1]) and
   columns [part[p][0], part[p][1]) for each part p returned, part[p][2] = 1 for a symmetric
   part (the rows' states its columns' first ones): K(X,Y) and full rows one part (all columns);
   K(X,X) into device buffers or a callback (no rectangle's mirror to deliver) one symmetric part
   from the diagonal to n, its band of a job over X[a:] (qk_cuda_io.band_rows: the diagonal
   block a triangle and its mirror, the rectangle right of it without one, one state build and
   set-up); K(X,X) into host memory or a file the diagonal block and, unless the band ends at n,
   the rectangle right of it (whose mirror the device writes too). */
QK__PRIV int qk__mgpu_parts(const qk_plan *plan, int k, int64_t part[2][3])
{
    const int64_t a = plan->dev_row0[k], b = plan->dev_row0[k + 1];
    int n = 0;
    if (b <= a) return 0;
    if (!plan->symmetric || plan->dev_full_rows) { part[0][0] = 0; part[0][1] = plan->n_y; part[0][2] = 0; return 1; }
    if (plan->output == QK_OUTPUT_DEVICE || plan->output == QK_OUTPUT_CALLBACK) {
        part[0][0] = a; part[0][1] = plan->n_x; part[0][2] = 1;
        return 1;
    }
    part[n][0] = a; part[n][1] = b; part[n][2] = 1; n++;
    if (b < plan->n_x) { part[n][0] = b; part[n][1] = plan->n_x; part[n][2] = 0; n++; }
    return n;
}

/* The job of part pp of a plan of several devices as its GPU runs it (the planner plans it with
   this desc, the engine runs it with this desc and its output added): X's rows of the band, Y's
   columns of the part; a symmetric part (y NULL) the job over X's rows of its columns, of which
   the engine delivers the first n_rows (qk_cuda_io.band_rows where n_cols > n_rows); the
   precision and out_dtype the whole plan resolved. d: features per sample. Planning reads no
   sample, so x may be NULL there. */
QK__PRIV void qk__mgpu_part_desc(const qk_plan *plan, const qk_plan_part *pp, int d, const qk_gram_desc *desc, qk_gram_desc *sd)
{
    static const double none[1] = {0.0};   /* a rectangle's y when the planner got no data */
    const double *Y = desc->y ? desc->y : desc->x;
    memset(sd, 0, sizeof *sd);
    sd->x = desc->x ? desc->x + pp->row0 * d : NULL;
    sd->n_x = pp->symmetric ? pp->n_cols : pp->n_rows;
    sd->y = pp->symmetric ? NULL : Y ? Y + pp->col0 * d : none;
    sd->n_y = pp->symmetric ? 0 : pp->n_cols;
    sd->precision = plan->precision;
    sd->out_dtype = plan->out_dtype;
    sd->path = desc->path;
    sd->output = desc->output;
}

/* The plan part i of a plan of several devices runs (what qk_plan_for_device made for its job on
   its GPU, autotuned by qk_plan_make): the part's fields over the whole plan's shared ones.
   device_name: that GPU's (qk_device_info.name; NULL: none). */
QK__PRIV void qk__plan_part_plan(const qk_plan *plan, int i, const char *device_name, qk_plan *sp)
{
    const qk_plan_part *pp = &plan->parts[i];
    memset(sp, 0, sizeof *sp);
    sp->backend = QK_BACKEND_CUDA;
    sp->path = plan->path;
    sp->precision = plan->precision;
    sp->error_bound = plan->error_bound;
    sp->linear = plan->linear;
    sp->out_dtype = plan->out_dtype;
    sp->output = plan->output;
    sp->n_qubits = plan->n_qubits;
    sp->n_x = pp->symmetric ? pp->n_cols : pp->n_rows;   /* a symmetric part: the job over its columns (a band of its rows) */
    sp->n_y = pp->n_cols;
    sp->symmetric = pp->symmetric;
    sp->bulk_states = pp->bulk_states;
    sp->state_tile = pp->state_tile;
    sp->tile_m = pp->tile_m;
    sp->tile_n = pp->tile_n;
    sp->n_streams = pp->n_streams;
    sp->slab_rows = pp->slab_rows;
    sp->host_pinned = pp->host_pinned;
    sp->bytes_states = pp->bytes_states;
    sp->bytes_out = pp->bytes_out;
    sp->bytes_staging = pp->bytes_staging;
    sp->bytes_workspace = pp->bytes_workspace;
    sp->bytes_total = pp->bytes_total;
    sp->bytes_budget = pp->bytes_budget;
    sp->k_resident = pp->k_resident;
    sp->engine = pp->engine;
    sp->use_blas = (int)pp->engine;
    sp->kernel_cfg = pp->kernel_cfg;
    memcpy(sp->config, pp->config, sizeof sp->config);
    if (device_name) snprintf(sp->device_name, sizeof sp->device_name, "%s", device_name);
    qk__plan_one_device(sp, 0);
}

/* Stores the plan sp of part i (its geometry already in plan->parts[i]) and checks that the part
   carries all of it: qk__plan_part_plan gives sp back byte for byte (device_name: the GPU's),
   so what runs is what was planned; else QK_ERROR_UNSUPPORTED (a part planned on another path,
   another engine family or precision than the whole job: an internal error). */
QK__PRIV qk_result qk__plan_part_set(qk_plan *plan, int i, const qk_plan *sp, const char *device_name)
{
    qk_plan_part *pp = &plan->parts[i];
    qk_plan back;
    if (sp->backend != QK_BACKEND_CUDA || sp->path == QK_PATH_MPS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "the part was planned on the %s (internal error)",
                        sp->backend != QK_BACKEND_CUDA ? "CPU engine" : "MPS path");
    pp->bulk_states = sp->bulk_states;
    pp->state_tile = sp->state_tile;
    pp->tile_m = sp->tile_m;
    pp->tile_n = sp->tile_n;
    pp->n_streams = sp->n_streams;
    pp->slab_rows = sp->slab_rows;
    pp->host_pinned = sp->host_pinned;
    pp->bytes_states = sp->bytes_states;
    pp->bytes_out = sp->bytes_out;
    pp->bytes_staging = sp->bytes_staging;
    pp->bytes_workspace = sp->bytes_workspace;
    pp->bytes_total = sp->bytes_total;
    pp->bytes_budget = sp->bytes_budget;
    pp->k_resident = sp->k_resident;
    pp->engine = sp->engine;
    pp->kernel_cfg = sp->kernel_cfg;
    memcpy(pp->config, sp->config, sizeof pp->config);
    qk__plan_part_plan(plan, i, device_name, &back);
    if (memcmp(&back, sp, sizeof back) != 0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "the part's plan differs from the whole job's beyond what a part holds "
                        "(path %d / %d, precision %s / %s; internal error)", (int)sp->path, (int)plan->path,
                        qk_precision_name(sp->precision), qk_precision_name(plan->precision));
    return QK_OK;
}

/* A plan of several devices carries every device's parts, those qk__mgpu_parts names, in order
   (a plan made by qk_plan_make or qk_plan_for_devices does; one put together otherwise may not):
   QK_OK, else QK_ERROR_INVALID_ARGUMENT with a message naming the first difference. */
QK__PRIV qk_result qk__mgpu_check_parts(const qk_plan *plan)
{
    int k, i, n = 0;
    if (plan->n_parts < 0 || plan->n_parts > QK_MAX_PARTS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: plan.n_parts = %d (at most %d)", plan->n_parts, QK_MAX_PARTS);
    for (k = 0; k < plan->n_devices; k++) {
        int64_t part[2][3];
        const int np = qk__mgpu_parts(plan, k, part);
        for (i = 0; i < np; i++, n++) {
            const qk_plan_part *pp = &plan->parts[n];
            if (n >= plan->n_parts || pp->device != k || pp->symmetric != (int)part[i][2] || pp->row0 != plan->dev_row0[k] ||
                pp->n_rows != plan->dev_row0[k + 1] - plan->dev_row0[k] || pp->col0 != part[i][0] || pp->n_cols != part[i][1] - part[i][0] ||
                pp->mirror != (plan->symmetric && !pp->symmetric && !plan->dev_full_rows))
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of %d GPUs without the plan of GPU %d's part %d "
                                "(plan.parts; qk_plan_make and qk_plan_for_devices make them)", plan->n_devices, plan->devices[k], i + 1);
        }
    }
    if (n != plan->n_parts)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: plan.n_parts = %d, the devices' rows make %d parts", plan->n_parts, n);
    return QK_OK;
}

static qk_result qk__plan_for_device(const qk_device_info *info, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    if (!info || !map || !desc || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: NULL argument");
    if (!(vram_fraction >= 0.0 && vram_fraction <= 1.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: vram_fraction must be in (0, 1] (got %g)", vram_fraction);
    if (desc->n_x <= 0 || (desc->y && desc->n_y <= 0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: n_x and n_y must be > 0");
    if ((int)desc->precision < (int)QK_PRECISION_DEFAULT || (int)desc->precision >= QK_PRECISION_COUNT)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: unknown precision %d", (int)desc->precision);
    if (!(desc->tol >= 0.0 && desc->tol <= 1e300))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: tol must be finite and >= 0 (got %g)", desc->tol);
    if (keep) memset(keep, 0, sizeof *keep);
    if (!info->present) return qk__plan_cpu(info, map, desc, out, keep);
    /* an entangled map with the path left to the planner or forced to MPS: the GPU's statevector
       plan (when it can be made) against the MPS path on the GPU (qk__mps_decide) */
    if ((int)desc->path < 0 || (int)desc->path > (int)QK_PATH_MPS || desc->path == QK_PATH_MPS ||
        (map->cls != QK_CLASS_PRODUCT && desc->path == QK_PATH_DEFAULT)) {
        qk__mps_prog prog;
        qk_result rs = QK_ERROR_UNSUPPORTED, r;
        int use = 0;
        if (desc->path == QK_PATH_DEFAULT && map->n_qubits <= QK_MAX_STATE_QUBITS)
            rs = qk__plan_cuda(info, vram_fraction, map, desc, out);
        r = qk__mps_decide(map, desc, QK__MPS_GPU_FLOP_RATIO, rs == QK_OK, 0, &prog, &use);
        if (r != QK_OK) return r;
        if (!use)   /* the statevector plan, or its error again (with its detail) */
            return rs == QK_OK ? QK_OK : qk__plan_cuda(info, vram_fraction, map, desc, out);
        r = qk__plan_cuda_mps(info, vram_fraction, map, desc, &prog, out);
        if (r == QK_OK && keep) *keep = prog;   /* the engine's program: not built again */
        else qk__mps_prog_free(&prog);
        return r;
    }
    return qk__plan_cuda(info, vram_fraction, map, desc, out);
}

/* Autotune of a CUDA plan (qk_ctx_desc.autotune, docs/autotune.md): the Gram engine's
   configuration ("engine=E,cfg=C": qk_plan.engine by its qk__engine_name, and kernel_cfg) for
   (device, driver, path, precision, qubits) comes from the cache, or from qk_cuda_tune_gram on a
   miss (stored), or from the fixed table above; plan->config says which. For qk_plan_make: call
   after qk_plan_for_device. */

#if defined(QK_CUDA) && QK_CUDA
/* The engine configuration an autotune cache entry names: "engine=<name>,cfg=<c>", or the form
   written before qk_plan.engine, "blas=<n>,cfg=<c>" (n the engine's value, which the enum kept).
   0 for anything else (the entry is then ignored: the fixed table). */
static int qk__engine_config_parse(const char *s, qk_gpu_engine *e, int *cfg)
{
    char name[24];
    int n, c, k;
    if (sscanf(s, "blas=%d,cfg=%d", &n, &c) == 2) {
        if (n < 0 || n >= (int)QK_GPU_ENGINE_COUNT) return 0;
        *e = (qk_gpu_engine)n;
        *cfg = c;
        return 1;
    }
    if (sscanf(s, "engine=%23[^,],cfg=%d", name, &c) != 2) return 0;
    for (k = 0; k < (int)QK_GPU_ENGINE_COUNT; k++)
        if (strcmp(name, qk__engine_name((qk_gpu_engine)k)) == 0) {
            *e = (qk_gpu_engine)k;
            *cfg = c;
            return 1;
        }
    return 0;
}
static qk_result qk__cuda_measure(const qk_tune_key *key, char *config, size_t size, double *metric, void *user)
{
    const qk_plan *plan = (const qk_plan *)user;
    qk_cuda_tune_result res;
    char err[256] = "";
    int64_t n = key->n_qubits <= 8 ? 16384 : key->n_qubits <= 12 ? 4096 : 1024;
    qk_result r = qk_cuda_tune_gram(plan, n, 3, &res, err, sizeof err);
    const char *name;
    if (r != QK_OK) return qk__fail(r, "%s", err);
    name = qk__engine_name((qk_gpu_engine)res.blas[res.best]);
    if (!name) return qk__fail(QK_ERROR_UNSUPPORTED, "autotune: candidate engine %d (internal error)", res.blas[res.best]);
    snprintf(config, size, "engine=%s,cfg=%d", name, res.cfg[res.best]);
    *metric = (double)res.n_samples * (double)res.n_samples / (res.ms[res.best] * 1e6); /* Gpairs/s */
    return QK_OK;
}

QK__PRIV void qk__plan_autotune(const qk_device_info *info, int mode, const char *cache_dir, qk_log_fn log,
                                void *log_user, qk_plan *plan)
{
    qk_tune_request req;
    char fixed[48], chosen[64], label[96];
    qk_gpu_engine b = plan->engine, pe = plan->engine;
    int c = plan->kernel_cfg;
    /* density matrices (plan.linear) run the cuBLAS engine the planner named: the other engines
       square the inner product (and the cache keys do not tell the two jobs apart) */
    if (plan->backend != QK_BACKEND_CUDA || plan->path == QK_PATH_ANALYTIC || plan->linear) return;
    memset(&req, 0, sizeof req);
    qk_tune_key_init(&req.key, info->name, info->cc_major, info->cc_minor, info->driver_version, "gram", plan->path,
                     plan->precision, plan->n_qubits);
    snprintf(fixed, sizeof fixed, "engine=%s,cfg=%d", qk__engine_name(plan->engine), plan->kernel_cfg);
    req.mode = mode;
    req.cache_dir = cache_dir;
    req.fixed_config = fixed;
    req.measure = qk__cuda_measure;
    req.measure_user = plan;
    req.log = log;
    req.log_user = log_user;
    if (qk_tune_choose(&req, chosen, sizeof chosen, label, sizeof label) != QK_OK) return;
    /* a tensor-core engine only where the planner counted its operands (not where they did not
       fit: the planner fell back to CUBLAS) */
    if (qk__engine_config_parse(chosen, &b, &c) && c >= 0 && c <= QK__N_FUSED_CFG &&
        qk__blas_ok(plan->precision, plan->path, b) &&
        /* the fused tensor-core kernel only where the planner counted its operands */
        !(qk__engine_tcf(b) && qk__tcf_ws(b, plan->path == QK_PATH_COMPLEX, plan->n_qubits,
                                          plan->bulk_states ? (double)(plan->n_x + (plan->symmetric ? 0 : plan->n_y)) : 2.0 * (double)plan->state_tile) >
                                   (double)plan->bytes_workspace) &&
        !((b == QK_GPU_TCF_TF32 || b == QK_GPU_TCF_FP16) && plan->n_qubits > QK__TCF_NOFLUSH_MAX_QUBITS) &&
        /* the wgmma configuration only where this device and build run it (a cache written by
           another build may name it) */
        !(qk__engine_tcf(b) && c == 4 && !info->wgmma) &&
        !(qk__engine_tcf_of(b) != QK_GPU_FUSED && qk__engine_tcf(pe) &&
          qk__blas_ws(b, plan->path == QK_PATH_COMPLEX, plan->n_qubits, 4.0, (double)plan->tile_m, (double)plan->tile_n) > (double)plan->bytes_workspace) &&
        !((qk__engine_tc(b) || qk__engine_tcf(b)) && pe == QK_GPU_CUBLAS && qk__tc_mode(plan->precision) && plan->n_qubits >= qk__tc_min_qubits(plan->precision)) &&
        !((qk__engine_tc(b) || qk__engine_tcf(b)) && plan->n_qubits > QK__TC_MAX_QUBITS)) {
        qk__plan_set_engine(plan, b);
        plan->kernel_cfg = qk__plan_cfg_runs(plan, b, c);   /* the configuration that runs (8 -> 7 -> 1, ...) */
    }
    if (plan->engine == b && plan->kernel_cfg != c)
        snprintf(plan->config, sizeof plan->config, "%.72s (runs cfg %d)", label, plan->kernel_cfg);
    else snprintf(plan->config, sizeof plan->config, "%s", label);
}
#endif /* QK_CUDA */

/* Largest n such that K(X,X) of n samples keeps all its states resident (bulk) on the device,
   for a zz-like map of n_qubits (scratch counted as for a map with one gate layer and two
   phase runs); K itself is not counted (it may go out in slabs). */
QKDEF int64_t qk_max_samples(const qk_device_info *info, double vram_fraction, int n_qubits,
                             qk_precision precision)
{
    double t = precision == QK_PRECISION_FP64 ? 8.0 : 4.0, q = n_qubits, st, sc, budget;
    if (!info || n_qubits < 1 || n_qubits > QK_MAX_STATE_QUBITS) return 0;
    if (!info->present) {
        /* the CPU plan's bulk test (qk__plan_cpu_nt) for a complex map of one gate layer: the
           states (fp64 complex, 16 x 2^q bytes each) and the scratch of every core's thread */
        double avail, b = qk__host_budget(info, &avail), scr = qk__cpu_scratch_q(n_qubits, qk__ncores());
        double per = 16.0 * ldexp(1.0, n_qubits);
        return b > scr ? (int64_t)floor((b - scr) / per) : 0;
    }
    budget = (vram_fraction > 0 && vram_fraction <= 1 ? vram_fraction : 0.85) * (double)info->free_bytes;
    /* a complex zz-like map with a feature per qubit: 20 params per qubit, two phase runs */
    qk__vram_per_state(n_qubits, n_qubits, 20.0 * q + 2.0 * (1 + q + q * q) + 1, QK_PATH_COMPLEX, t, &st, &sc);
    return (int64_t)floor(0.5 * budget / (st + sc)); /* integers below 2^53: exact in any order */
}

/* ---- end planner ---- */

/* >>ctx ---- the context (qk_ctx), qk_plan_make, qk_plan_describe ---- */
/* struct qk_ctx: in qk_internal.h (the runners read it) */

static void qk__log(const qk_ctx *ctx, qk_log_level lvl, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (!ctx || !ctx->desc.log) return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->desc.log(lvl, msg, ctx->desc.log_user);
}

QKDEF qk_result qk_ctx_create(const qk_ctx_desc *desc_in, qk_ctx **out)
{
    qk_ctx_desc d;
    qk_ctx *ctx;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: out is NULL");
    *out = NULL;
    if (desc_in) d = *desc_in; else memset(&d, 0, sizeof d);
    if (d.device < QK_DEVICE_AUTO || d.device > QK_DEVICE_CUDA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: unknown device %d", (int)d.device);
    if (d.n_threads < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: n_threads must be >= 0 (got %d)", d.n_threads);
    if (d.cuda_device < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cuda_device must be >= 0");
    if (d.vram_fraction < 0.0 || d.vram_fraction > 1.0 || d.vram_fraction != d.vram_fraction)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: vram_fraction must be in (0, 1] (got %g)", d.vram_fraction);
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: allocator needs both alloc and free");
    d.n_threads = qk__def_i(d.n_threads, qk__ncores());
    d.vram_fraction = qk__def_d(d.vram_fraction, 0.85);
    if (d.autotune < -1 || d.autotune > 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: autotune must be -1, 0 or 1 (got %d)", d.autotune);
    if (d.n_cuda_devices < 0 || d.n_cuda_devices > QK_MAX_DEVICES)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: n_cuda_devices must be in [0, %d] (got %d)", QK_MAX_DEVICES, d.n_cuda_devices);
    if (d.cuda_devices && d.n_cuda_devices > 0) {
        int i, j;
        for (i = 0; i < d.n_cuda_devices; i++) {
            if (d.cuda_devices[i] < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cuda_devices[%d] = %d (ordinals are >= 0)", i, d.cuda_devices[i]);
            for (j = 0; j < i; j++)
                if (d.cuda_devices[j] == d.cuda_devices[i])
                    return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: CUDA device %d is listed twice in cuda_devices", d.cuda_devices[i]);
        }
    }
    if (d.cache_dir && strlen(d.cache_dir) >= sizeof ctx->cache_dir - 16)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_ctx_create: cache_dir longer than %d characters", (int)sizeof ctx->cache_dir - 16);
    ctx = (qk_ctx *)qk__alloc_with(&d.allocator, sizeof *ctx);
    if (!ctx) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_ctx_create: out of memory");
    memset(ctx, 0, sizeof *ctx);
    ctx->desc = d;
    if (d.cache_dir) {
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", d.cache_dir);
        ctx->desc.cache_dir = ctx->cache_dir;
    }
    ctx->desc.cuda_devices = NULL;
    ctx->desc.n_cuda_devices = 0;
    if (d.device != QK_DEVICE_CPU) {
#if defined(QK_CUDA) && QK_CUDA
        int n = qk_cuda_device_count(), nl, i, bad = -1;
        char err[256] = "";
        /* the device list (qk_ctx_desc.n_cuda_devices) */
        if (d.n_cuda_devices > 0) {
            nl = d.n_cuda_devices;
            for (i = 0; i < nl; i++) ctx->dev_ord[i] = d.cuda_devices ? d.cuda_devices[i] : nl == 1 ? d.cuda_device : i;
        } else if (d.cuda_device != 0 || n <= 1) {
            nl = 1;
            ctx->dev_ord[0] = d.cuda_device;
        } else {
            nl = n < QK_MAX_DEVICES ? n : QK_MAX_DEVICES;
            for (i = 0; i < nl; i++) ctx->dev_ord[i] = i;
        }
        for (i = 0; i < nl && bad < 0; i++)
            if (ctx->dev_ord[i] >= n || qk_cuda_device_query(ctx->dev_ord[i], &ctx->dev_info[i], err, sizeof err) != QK_OK) bad = ctx->dev_ord[i];
        if (bad < 0 && nl > 1 && qk_cuda_set_device(ctx->dev_ord[0], err, sizeof err) != QK_OK) bad = ctx->dev_ord[0];
        if (bad < 0) {
            ctx->n_dev = nl;
            ctx->dev = ctx->dev_info[0];
            ctx->desc.device = QK_DEVICE_CUDA;
            ctx->desc.cuda_device = ctx->dev_ord[0];
            ctx->desc.cuda_devices = ctx->dev_ord;
            ctx->desc.n_cuda_devices = nl;
        } else if (d.device == QK_DEVICE_CUDA) {
            qk_ctx_destroy(ctx);
            if (n <= 0) return qk__fail(QK_ERROR_NO_DEVICE, "device cuda requested but no CUDA device is present");
            return qk__fail(QK_ERROR_NO_DEVICE, "CUDA device %d unavailable (%d present)%s%s", bad, n, err[0] ? ": " : "", err);
        } else {
            memset(&ctx->dev, 0, sizeof ctx->dev);
            ctx->desc.device = QK_DEVICE_CPU;
            qk__log(ctx, QK_LOG_INFO, "no CUDA device found; using the CPU engine");
        }
#else
        if (d.device == QK_DEVICE_CUDA) {
            qk_ctx_destroy(ctx);
            return qk__fail(QK_ERROR_NO_DEVICE, "device cuda requested but this build has no CUDA engine (compile qk_cuda.cu and define QK_CUDA=1)");
        }
        ctx->desc.device = QK_DEVICE_CPU;
        qk__log(ctx, QK_LOG_INFO, "built without the CUDA engine; using the CPU engine");
#endif
    }
    ctx->dev.host_budget_bytes = d.host_memory;   /* the CPU engine's plans (0: read at plan time) */
    *out = ctx;
    return QK_OK;
}

/* A pool of the context (*slot: qk_ctx.pool, or gpool of several GPUs) of n threads, the
   caller one of them, started by the first call that needs it; NULL where n < 2 or its threads
   cannot start (every step then starts its own, or runs on the caller). spin: qk__tpool.spin. */
QK__PRIV qk__tpool *qk__ctx_pool_of(qk_ctx *ctx, qk__tpool **slot, int n, int spin)
{
    if (*slot && qk__tpool_forked(*slot)) {   /* a forked child: the workers are the parent's; start its own */
        qk__free_with(&ctx->desc.allocator, *slot);
        *slot = NULL;
    }
    if (!*slot && n > 1) {
        qk__tpool *t = (qk__tpool *)qk__alloc_with(&ctx->desc.allocator, sizeof *t);
        if (t && qk__tpool_start(t, n) == QK_OK) {
            t->spin = spin;
            *slot = t;
        } else qk__free_with(&ctx->desc.allocator, t);
    }
    return *slot;
}

/* The context's pool of CPU threads: every parallel step of its calls runs on it */
QK__PRIV qk__tpool *qk__ctx_pool(qk_ctx *ctx)
{
    return qk__ctx_pool_of(ctx, &ctx->pool, ctx->desc.n_threads, 0);
}

QKDEF void qk_ctx_destroy(qk_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->pool) {
        if (!qk__tpool_forked(ctx->pool)) qk__tpool_stop(ctx->pool);
        qk__free_with(&ctx->desc.allocator, ctx->pool);
    }
    if (ctx->gpool) {
        if (!qk__tpool_forked(ctx->gpool)) qk__tpool_stop(ctx->gpool);
        qk__free_with(&ctx->desc.allocator, ctx->gpool);
    }
#if defined(QK_CUDA) && QK_CUDA
    {
        int k;
        qk_cuda_host_free(ctx->stage[0]);
        qk_cuda_host_free(ctx->stage[1]);
        for (k = 0; k < QK_MAX_DEVICES; k++) {
            qk_cuda_host_free(ctx->dstage[k][0]);
            qk_cuda_host_free(ctx->dstage[k][1]);
            qk_cuda_pool_destroy(ctx->spool[k]);
        }
    }
#endif
    qk__free_with(&ctx->desc.allocator, ctx);
}

QKDEF qk_cuda_stats qk_ctx_cuda_stats(const qk_ctx *ctx)
{
    qk_cuda_stats st;
    if (ctx) return ctx->cuda_stats;
    memset(&st, 0, sizeof st);
    return st;
}

QKDEF int qk_ctx_device_seconds(const qk_ctx *ctx, double *seconds, int max)
{
    int k;
    if (!ctx) return 0;
    for (k = 0; seconds && k < ctx->n_dev_last && k < max; k++) seconds[k] = ctx->dev_seconds[k];
    return ctx->n_dev_last;
}

QKDEF int qk_ctx_device_stats(const qk_ctx *ctx, qk_cuda_stats *stats, int max)
{
    int k;
    if (!ctx) return 0;
    for (k = 0; stats && k < ctx->n_dev_last && k < max; k++) stats[k] = ctx->n_dev_last == 1 ? ctx->cuda_stats : ctx->dev_stats[k];
    return ctx->n_dev_last;
}

QKDEF qk_ctx_desc qk_ctx_query(const qk_ctx *ctx)
{
    qk_ctx_desc d;
    if (ctx) return ctx->desc;
    memset(&d, 0, sizeof d);
    return d;
}

/* Given host states (qk_gram_states: the data are the states themselves, gigabytes maybe): every
   row checked as qk_map_check_data checks it, on the context's threads in blocks of rows. Where a
   block fails, the rows are checked again in order on the calling thread, which names the first
   bad row (the detail message is per thread). */
typedef struct qk__scheck {
    const qk__smap *sm;
    const double *x;
    int64_t n, next;
    int any, side;          /* any: a block failed (the workers stop claiming more) */
} qk__scheck;
#define QK__SCHECK_ROWS 256
static void qk__scheck_work(void *arg, int thread)
{
    qk__scheck *j = (qk__scheck *)arg;
    const int64_t rowb = (int64_t)j->sm->map.n_features * 8;
    int64_t i0;
    QK__UNUSED(thread);
    while (!QK__LOAD(&j->any) && (i0 = QK__FETCH_ADD(&j->next, QK__SCHECK_ROWS)) < j->n) {
        const int64_t k = j->n - i0 < QK__SCHECK_ROWS ? j->n - i0 : QK__SCHECK_ROWS;
        if (qk__states_check(j->sm, (const char *)(const void *)j->x + (size_t)(i0 * rowb), k, rowb, j->side, i0) != QK_OK) {
            QK__STORE(&j->any, 1);
        }
    }
}
static qk_result qk__check_data(const qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, const char *name)
{
    qk__scheck j;
    int nt;
    if (!x || n < 4 * QK__SCHECK_ROWS || !qk__map_is_states(map) || (map->ops[0].q1 & (QK__STATE_PROVIDER | QK__STATE_DEVICE)))
        return qk_map_check_data(map, x, n, name);
    memset(&j, 0, sizeof j);
    j.sm = (const qk__smap *)(const void *)map;
    j.x = x;
    j.n = n;
    j.side = strcmp(name, "Y") == 0;
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    if ((int64_t)nt > n / QK__SCHECK_ROWS) nt = (int)(n / QK__SCHECK_ROWS);
    qk__parallel(nt, qk__scheck_work, &j);
    if (!j.any) return QK_OK;
    /* a block failed; blocks before it may be unchecked (the workers stop claiming): the rows
       are checked again in order on this thread, whose message names the first bad row */
    return qk_map_check_data(map, x, n, name);
}

/* Checks everything about a Gram request that does not depend on the engine. */
QK__PRIV qk_result qk__check_gram(const qk_ctx *ctx, const qk_map *map, const qk_gram_desc *d)
{
    int64_t cols;
    qk_result r;
    if (!ctx) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ctx is NULL");
    if (!map) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: map is NULL");
    if (!d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: desc is NULL");
    if (!d->x) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: x is NULL");
    if (d->n_x <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: n_x must be > 0 (got %lld)", (long long)d->n_x);
    if (d->y && d->n_y <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: n_y must be > 0 (got %lld)", (long long)d->n_y);
    if (d->output < QK_OUTPUT_HOST || d->output > QK_OUTPUT_NPY) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown output mode %d", (int)d->output);
    if (d->output == QK_OUTPUT_CALLBACK && !d->tile_fn) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output CALLBACK needs tile_fn");
    r = qk__mps_check_trunc(d);
    if (r != QK_OK) return r;
    if (d->output == QK_OUTPUT_NPY && (!d->out_path || !d->out_path[0])) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output NPY needs out_path");
    if ((d->output == QK_OUTPUT_HOST || d->output == QK_OUTPUT_DEVICE) && !d->out && !(d->output == QK_OUTPUT_DEVICE && d->out_devices))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: out is NULL");
    if (d->output == QK_OUTPUT_DEVICE && ctx->desc.device != QK_DEVICE_CUDA) return qk__fail(QK_ERROR_NO_DEVICE, "qk_gram: output DEVICE needs the CUDA engine (context runs on the CPU)");
    if (d->out_dtype < QK_DTYPE_DEFAULT || d->out_dtype > QK_F64) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown out_dtype %d", (int)d->out_dtype);
    if ((int)d->precision < (int)QK_PRECISION_DEFAULT || (int)d->precision >= QK_PRECISION_COUNT) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: unknown precision %d", (int)d->precision);
    if (!(d->tol >= 0.0 && d->tol <= 1e300)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: tol must be finite and >= 0 (got %g)", d->tol);
    if (d->mgpu_min_pairs < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mgpu_min_pairs must be >= 0 (0: QK_MGPU_MIN_PAIRS; got %lld)", (long long)d->mgpu_min_pairs);
    if (d->mgpu_host_bound_split < -1 || d->mgpu_host_bound_split > 1)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: mgpu_host_bound_split must be -1 (no), 0 (QK_MGPU_HOST_BOUND_SPLIT) or 1 (yes), got %d", d->mgpu_host_bound_split);
    cols = d->y ? d->n_y : d->n_x;
    if (d->output == QK_OUTPUT_NPY && d->ld_out != 0 && d->ld_out != cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ld_out has no meaning for output NPY (got %lld)", (long long)d->ld_out);
    if (d->ld_out != 0 && d->ld_out < cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: ld_out %lld < columns %lld", (long long)d->ld_out, (long long)cols);
    r = qk__check_data(ctx, map, d->x, d->n_x, "X");
    if (r != QK_OK) return r;
    if (d->y) {
        r = qk__check_data(ctx, map, d->y, d->n_y, "Y");
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

#if defined(QK_CUDA) && QK_CUDA
/* A plan of several GPUs: each part's configuration from the autotune (the cache, the whole
   plan's entry when the GPUs are alike; a miss measures on that GPU, made current for it), with
   autotune off (-1) or cache (0) whatever the context's mode (the whole plan's own autotune
   measures when it asks to), and, for a HOST output, whether the part's rows of the caller's
   buffer are page-locked. The first GPU is current afterwards. */
static qk_result qk__plan_parts_tune(qk_ctx *ctx, const qk_device_info *infos, const qk_gram_desc *desc, qk_plan *out)
{
    const int64_t ld = desc->ld_out ? desc->ld_out : out->n_y;
    const size_t es = out->out_dtype == QK_F32 ? 4 : 8;
    char err[256] = "";
    int k, i;
    qk_result r = QK_OK;
    for (k = out->n_devices - 1; k >= 0 && r == QK_OK; k--) {   /* the first GPU last: current afterwards */
        qk_plan sp;
        r = qk_cuda_set_device(out->devices[k], err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "CUDA device %d: %s", out->devices[k], err);
        for (i = 0; i < out->n_parts && r == QK_OK; i++) {
            const qk_plan_part *pp = &out->parts[i];
            if (pp->device != k) continue;
            qk__plan_part_plan(out, i, infos[k].name, &sp);
            qk__plan_autotune(&infos[k], ctx->desc.autotune < 0 ? -1 : 0, ctx->desc.cache_dir, NULL, NULL, &sp);
            if (desc->output == QK_OUTPUT_HOST && desc->out)
                sp.host_pinned = qk_cuda_host_pinned((const char *)desc->out + (size_t)(pp->row0 * ld + pp->col0) * es);
            r = qk__plan_part_set(out, i, &sp, infos[k].name);
        }
    }
    return r;
}
#endif

/* qk_plan_make; keep (may be NULL, else zeroed by the caller): an MPS plan's program, handed to
   the engine by qk_gram (the caller frees it). */
QK__PRIV qk_result qk__plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    qk_result r;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_make: out is NULL");
    if (!ctx || !map || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_make: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (ctx->desc.device == QK_DEVICE_CUDA) {
#if defined(QK_CUDA) && QK_CUDA
        char err[256] = "";
        qk_device_info info, infos[QK_MAX_DEVICES];
        int k;
        /* every GPU's free memory now; the first queried last (the query makes it current) */
        for (k = ctx->n_dev - 1; k >= 0; k--) {
            r = qk_cuda_device_query(ctx->dev_ord[k], &infos[k], err, sizeof err);
            if (r != QK_OK) return qk__fail(r, "CUDA device %d: %s", ctx->dev_ord[k], err);
            infos[k].free_bytes += qk_cuda_pool_bytes(ctx->spool[k]);  /* the pool's buffers serve the next job */
        }
        for (k = 0; k < (ctx->n_dev > 0 ? ctx->n_dev : 1); k++) infos[k].host_budget_bytes = ctx->desc.host_memory; /* the MPS path's CPU plan */
        info = infos[0];
        r = qk__plan_for_devices(infos, ctx->dev_ord, ctx->n_dev > 0 ? ctx->n_dev : 1, ctx->desc.vram_fraction, map, desc, out, keep);
        if (r == QK_OK && out->path == QK_PATH_MPS) {   /* the MPS path: its own kernels, no autotune */
            out->n_threads = ctx->desc.n_threads;
            qk__log(ctx, QK_LOG_INFO, "the MPS path runs on the GPU (%s; bond %d; the MPS are built on %d host threads)",
                    out->config, out->mps_bond, out->n_threads);
            return QK_OK;
        }
        if (r == QK_OK) qk__plan_autotune(&info, ctx->desc.autotune, ctx->desc.cache_dir, ctx->desc.log, ctx->desc.log_user, out);
        if (r == QK_OK && desc->output == QK_OUTPUT_HOST && desc->out) out->host_pinned = qk_cuda_host_pinned(desc->out);
        if (r == QK_OK && out->n_parts > 0) r = qk__plan_parts_tune(ctx, infos, desc, out);
#else
        r = qk__fail(QK_ERROR_NO_DEVICE, "no CUDA engine in this build");
#endif
    } else {
        r = qk__plan_cpu_nt(&ctx->dev, map, desc, ctx->desc.n_threads, out, keep);
    }
    return r;
}

QKDEF qk_result qk_plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__plan_make(ctx, map, desc, out, NULL);
}

static const char *qk__path_name(qk_path p)
{
    return p == QK_PATH_ANALYTIC ? "analytic (product map)" : p == QK_PATH_REAL ? "real statevector" :
           p == QK_PATH_MPS ? "mps (matrix product states)" : "complex statevector";
}

/* bytes as GB with three decimals and a '.' whatever the C locale (integer arithmetic: a host
   program's setlocale cannot turn it into "0,433"). */
static const char *qk__gb3(size_t bytes, char *buf, size_t n)
{
    unsigned long long mb = ((unsigned long long)bytes + 500000ull) / 1000000ull;
    snprintf(buf, n, "%llu.%03llu", mb / 1000ull, mb % 1000ull);
    return buf;
}

QKDEF int qk_plan_describe(const qk_plan *p, char *buf, size_t size)
{
    char g1[32], g2[32], g3[32], g4[32];
    size_t len = 0;
    if (buf && size) buf[0] = 0;
    if (!buf) size = 0;
    if (!p) return 0;
    qk__cat(buf, size, &len, "plan: %s on %s, path %s, %d qubits\n",
            p->backend == QK_BACKEND_CUDA ? "CUDA engine" : "CPU engine", p->device_name,
            qk__path_name(p->path), p->n_qubits);
    qk__cat(buf, size, &len, "  K(%s): %lld x %lld%s, output %s %s, precision %s\n",
            p->symmetric ? "X,X" : "X,Y", (long long)p->n_x, (long long)p->n_y,
            p->symmetric ? " (upper triangle computed, mirrored)" : "",
            p->output == QK_OUTPUT_DEVICE ? "device buffer" : p->output == QK_OUTPUT_CALLBACK ? "tile callback" :
            p->output == QK_OUTPUT_NPY ? "streamed to a .npy file" : p->host_pinned ? "pinned host buffer" : "host buffer",
            p->out_dtype == QK_F32 ? "float32" : "float64", qk_precision_name(p->precision));
    if (p->precision_note[0]) qk__cat(buf, size, &len, "  precision: %s\n", p->precision_note);
    if (p->path == QK_PATH_MPS && p->mps_given)
        qk__cat(buf, size, &len, "  mps: given tensors, bond dimension <= %d (the largest given bond), %lld flops per pair\n",
                p->mps_bond, (long long)p->mps_pair_flops);
    else if (p->path == QK_PATH_MPS && !p->mps_truncate)   /* integers only: the description is locale-free */
        qk__cat(buf, size, &len, "  mps: bond dimension <= %d (exact bound from the circuit), gates span <= %d sites, %lld flops per pair\n",
                p->mps_bond, p->mps_span, (long long)p->mps_pair_flops);
    else if (p->path == QK_PATH_MPS)
        qk__cat(buf, size, &len, "  mps: bond dimension <= %d (truncated; exact bound %d), gates span <= %d sites, %lld flops per pair; "
                "|K - K_exact| <= sqrt(eps_i) + sqrt(eps_j), eps per sample in mps_discarded\n",
                p->mps_bond, p->mps_exact_bond, p->mps_span, (long long)p->mps_pair_flops);
    if (p->backend == QK_BACKEND_CPU && !p->bulk_states)
        qk__cat(buf, size, &len, "  states: tiled, blocks of %lld samples (two resident), %s GB; K: %s GB; tiles %lld x %lld",
                (long long)p->state_tile, qk__gb3(p->bytes_states, g1, sizeof g1), qk__gb3(p->bytes_out, g2, sizeof g2),
                (long long)p->tile_m, (long long)p->tile_n);
    else
        qk__cat(buf, size, &len, "  states: %s, %s GB; K: %s GB; tiles %lld x %lld",
                p->bulk_states ? "all resident" : "state tiles", qk__gb3(p->bytes_states, g1, sizeof g1),
                qk__gb3(p->bytes_out, g2, sizeof g2), (long long)p->tile_m, (long long)p->tile_n);
    if (p->slab_rows > 0 && p->output != QK_OUTPUT_DEVICE)
        qk__cat(buf, size, &len, ", slabs of %lld rows (%s GB of host staging)", (long long)p->slab_rows,
                qk__gb3(p->bytes_staging, g1, sizeof g1));
    if (p->backend == QK_BACKEND_CPU) {
        qk__cat(buf, size, &len, ", %d threads", p->n_threads);
        if (p->bytes_budget && p->path != QK_PATH_MPS) {
            qk__cat(buf, size, &len, "\n  host memory: %s GB planned (states, slabs, scratch; K %s) of %s GB budget",
                    qk__gb3(p->bytes_total, g1, sizeof g1), p->output == QK_OUTPUT_HOST ? "in the caller's buffer" : "not held",
                    qk__gb3(p->bytes_budget, g2, sizeof g2));
            if (p->bytes_host_avail) qk__cat(buf, size, &len, " (85%% of %s GB available)", qk__gb3(p->bytes_host_avail, g3, sizeof g3));
            else qk__cat(buf, size, &len, " (given)");
        }
    } else {
        if (!p->bulk_states) qk__cat(buf, size, &len, ", state tile %lld", (long long)p->state_tile);
        qk__cat(buf, size, &len, ", %d streams\n  device memory: %s GB planned of %s GB budget (staging %s GB, workspace %s GB)",
                p->n_streams, qk__gb3(p->bytes_total, g1, sizeof g1), qk__gb3(p->bytes_budget, g2, sizeof g2),
                qk__gb3(p->bytes_staging, g3, sizeof g3), qk__gb3(p->bytes_workspace, g4, sizeof g4));
    }
    if (p->backend == QK_BACKEND_CUDA && (p->path == QK_PATH_REAL || p->path == QK_PATH_COMPLEX))
        qk__cat(buf, size, &len, "\n  engine: %s, kernel_cfg %d%s%s%s", qk__engine_name(p->engine) ? qk__engine_name(p->engine) : "?", p->kernel_cfg,
                p->engine == QK_GPU_FUSED ? " (" : "", p->engine == QK_GPU_FUSED ? qk__fused_cfg_name(p->kernel_cfg) : "",
                p->engine == QK_GPU_FUSED ? ")" : "");
    qk__cat(buf, size, &len, "\n  config: %s\n", p->config);
    if (p->n_devices > 1) {   /* integers only (locale-free) */
        int k, i;
        int64_t tot = 0, worst;
        for (k = 0; k < p->n_devices; k++) tot += p->dev_pairs[k];
        worst = (int64_t)(p->dev_imbalance * 10000.0 + 0.5);
        qk__cat(buf, size, &len, "  devices: %d GPUs, one host thread each, rows dealt by pair count (slowest share %lld.%04lld x the mean)%s\n",
                p->n_devices, (long long)(worst / 10000), (long long)(worst % 10000),
                !p->symmetric ? "" : p->dev_full_rows ? "; each: whole rows (the host's bytes bind: no mirror on the host)"
                : p->output == QK_OUTPUT_DEVICE || p->output == QK_OUTPUT_CALLBACK
                    ? "; each: its rows from the diagonal on, one call (the diagonal block mirrored, the rectangle right of it not)"
                    : "; each: its diagonal block (symmetric) + the rectangle right of it, mirrored");
        for (k = 0; k < p->n_devices; k++) {
            int64_t pc = tot > 0 ? (int64_t)((double)p->dev_pairs[k] * 10000.0 / (double)tot + 0.5) : 0, part[2][3];
            int np = qk__mgpu_parts(p, k, part);
            qk__cat(buf, size, &len, "    GPU %d: rows [%lld, %lld), %lld pairs (%lld.%02lld %%), %d part%s\n", p->devices[k],
                    (long long)p->dev_row0[k], (long long)p->dev_row0[k + 1], (long long)p->dev_pairs[k],
                    (long long)(pc / 100), (long long)(pc % 100), np, np == 1 ? "" : "s");
            for (i = 0; i < p->n_parts && i < QK_MAX_PARTS; i++) {   /* its parts' plans (what runs) */
                const qk_plan_part *pp = &p->parts[i];
                const char *en = qk__engine_name(pp->engine);
                if (pp->device != k) continue;
                qk__cat(buf, size, &len, "      [%lld, %lld) x [%lld, %lld) %s: %s, %s, kernel_cfg %d%s%s%s; states %s",
                        (long long)pp->row0, (long long)(pp->row0 + pp->n_rows), (long long)pp->col0, (long long)(pp->col0 + pp->n_cols),
                        pp->symmetric ? (pp->n_cols > pp->n_rows ? "band from the diagonal" : "diagonal block")
                                      : pp->mirror ? "rectangle + mirror" : "rows",
                        en ? en : "?", qk_precision_name(p->precision), pp->kernel_cfg,
                        pp->engine == QK_GPU_FUSED ? " (" : "", pp->engine == QK_GPU_FUSED ? qk__fused_cfg_name(pp->kernel_cfg) : "",
                        pp->engine == QK_GPU_FUSED ? ")" : "", pp->bulk_states ? "all resident" : "in tiles");
                if (!pp->bulk_states) qk__cat(buf, size, &len, " of %lld", (long long)pp->state_tile);
                if (pp->slab_rows > 0 && p->output != QK_OUTPUT_DEVICE) qk__cat(buf, size, &len, ", slabs of %lld rows", (long long)pp->slab_rows);
                if (pp->k_resident) qk__cat(buf, size, &len, ", K resident");
                qk__cat(buf, size, &len, ", %s of %s GB\n        config: %s\n", qk__gb3(pp->bytes_total, g1, sizeof g1),
                        qk__gb3(pp->bytes_budget, g2, sizeof g2), pp->config);
            }
        }
    }
    return (int)len;
}

/* >>delivery ---- the GPU engine's host-side slabs to the caller's output; several GPUs ---- */
/* A pageable host buffer gets each slab from pinned staging by several threads: one core copies
   about 10 GB/s into touched memory and far less into fresh memory (each first touch faults a
   page), PCIe delivers about 50 GB/s; the page faults of fresh memory run in parallel too. The
   copy of slab s runs while the GPU computes and copies slab s + 1. */
#if defined(QK_CUDA) && QK_CUDA
typedef struct qk__deliver {
    const qk_gram_desc *desc;
    qk__sink *sink;
    int64_t cols;
    size_t es;
    int n_threads;
    /* the slab being copied */
    char *dst;
    const char *src;
    int64_t rows, ld_dst, ld_src, chunk, next;
} qk__deliver;

/* A copy into memory that will not be read soon (the caller's K): non-temporal stores where
   SSE2 exists, so the destination's lines are not read first (a plain copy moves 3 bytes per
   byte: read source, read destination line, write it back). */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__SSE2__)
#include <emmintrin.h>
static void qk__copy_stream(void *dst, const void *src, size_t n)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
    _mm_sfence();
}
#else
#define qk__copy_stream(d, s, n) memcpy((d), (s), (n))
#endif

static void qk__deliver_copy_work(void *p, int thread)
{
    qk__deliver *d = (qk__deliver *)p;
    int64_t c, r;
    QK__UNUSED(thread);
    while ((c = QK__FETCH_ADD(&d->next, 1)) * d->chunk < d->rows) {
        int64_t r1 = (c + 1) * d->chunk < d->rows ? (c + 1) * d->chunk : d->rows;
        if (d->ld_dst == d->cols && d->ld_src == d->cols)
            qk__copy_stream(d->dst + (size_t)(c * d->chunk * d->ld_dst) * d->es, d->src + (size_t)(c * d->chunk * d->ld_src) * d->es,
                            (size_t)((r1 - c * d->chunk) * d->cols) * d->es);
        else
            for (r = c * d->chunk; r < r1; r++)
                qk__copy_stream(d->dst + (size_t)(r * d->ld_dst) * d->es, d->src + (size_t)(r * d->ld_src) * d->es, (size_t)d->cols * d->es);
    }
}

/* m rows of d->cols elements (ld apart) from pinned staging to dst (d->ld_dst apart) on up to
   d->n_threads threads, one per 8 MB at most. */
static void qk__deliver_host(qk__deliver *d, char *dst, int64_t m, const void *rows, int64_t ld)
{
    const int64_t bytes = m * d->cols * (int64_t)d->es;
    int nt = d->n_threads;
    d->dst = dst;
    d->src = (const char *)rows;
    d->rows = m;
    d->ld_src = ld;
    d->chunk = (int64_t)((4u << 20) / ((size_t)d->cols * d->es)) + 1;   /* ~4 MB per work item */
    d->next = 0;
    if ((int64_t)nt > bytes / (8 << 20) + 1) nt = (int)(bytes / (8 << 20) + 1);
    QK_PROF_BEGIN("host copy-out");
    qk__parallel(nt, qk__deliver_copy_work, d);
    QK_PROF_END("host copy-out");
}

static qk_result qk__deliver_rows(int64_t i0, int64_t m, const void *rows, int64_t ld, void *user)
{
    qk__deliver *d = (qk__deliver *)user;
    const qk_gram_desc *g = d->desc;
    qk__sink *s = d->sink;
    if (s->kind == QK_OUTPUT_NPY) return qk__npyw_rows(&s->npy, i0, 0, m, d->cols, rows, ld);
    if (s->kind == QK_OUTPUT_CALLBACK) {
        /* square tiles of the slab's height; symmetric: the diagonal tile and those right of it */
        int64_t j0;
        for (j0 = g->y ? 0 : i0; j0 < d->cols; j0 += m) {
            int64_t n = d->cols - j0 < m ? d->cols - j0 : m;
            if (s->tile_fn(i0, j0, m, n, (const char *)rows + (size_t)j0 * d->es, ld, s->tile_user))
                return qk__fail(QK_ERROR_CANCELLED, "tile callback cancelled the Gram");
        }
        return QK_OK;
    }
    qk__deliver_host(d, (char *)s->out + (size_t)(i0 * d->ld_dst) * d->es, m, rows, ld);
    return QK_OK;
}

/* The MPS path on the GPU: the MPS of X (and Y) built on the host (qk__mps_states, the engine's
   threads), repacked for qk_cuda_mps_gram: [site][entry][sample] complex, each site padded to
   chi x 2 x chi (qk__mps_gpu_chi), one site per work item. */
typedef struct qk__mps_pack_job {
    const qk__mps_prog *p;
    const double *src;      /* lane layout (qk__mps_states) */
    double *dst;
    int64_t n, next;
    int chi;
} qk__mps_pack_job;

static void qk__mps_pack_work(void *arg, int thread)
{
    qk__mps_pack_job *j = (qk__mps_pack_job *)arg;
    const int c = j->chi, E = 2 * c * c;
    int64_t s;
    QK__UNUSED(thread);
    while ((s = QK__FETCH_ADD(&j->next, 1)) < j->p->q) {
        const int dl = j->p->D[s], dr = j->p->D[s + 1];
        double *site = j->dst + (size_t)s * (size_t)E * (size_t)j->n * 2;
        int64_t i;
        int l, a, r;
        for (l = 0; l < dl; l++)
            for (a = 0; a < 2; a++)
                for (r = 0; r < dr; r++) {
                    const size_t se = ((size_t)l * 2 + a) * (size_t)dr + (size_t)r;   /* lane layout entry */
                    double *o = site + (((size_t)l * 2 + a) * (size_t)c + (size_t)r) * (size_t)j->n * 2;
                    for (i = 0; i < j->n; i++) {
                        const double *g = j->src + (i / QK__NJ) * j->p->group + j->p->off[s] + se * 2 * QK__NJ + (i % QK__NJ);
                        o[2 * i] = g[0];
                        o[2 * i + 1] = g[QK__NJ];
                    }
                }
    }
}

/* n samples' MPS packed for the GPU (NULL with the error set when memory runs out); eps: n
   per-sample truncation bounds, or NULL. */
static double *qk__mps_gpu_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int nt, int chi, double *eps)
{
    qk__mps_pack_job j;
    double *lanes = qk__mps_states(p, m, x, n, nt, NULL, eps, NULL), *out;
    const double vals = (double)p->q * 2.0 * chi * chi * (double)n * 2.0;
    if (!lanes) return NULL;
    out = vals * 8.0 < 9.0e18 ? (double *)qk__calloc((size_t)vals, sizeof(double)) : NULL;
    if (!out) {
        QK_FREE(lanes);
        qk__set_error("mps: cannot allocate %.3g GB of host memory to pack %lld MPS for the GPU", vals * 8e-9, (long long)n);
        return NULL;
    }
    memset(&j, 0, sizeof j);
    j.p = p; j.src = lanes; j.dst = out; j.n = n; j.chi = chi;
    qk__parallel(nt < p->q ? nt : p->q, qk__mps_pack_work, &j);
    QK_FREE(lanes);
    return out;
}

/* planned: the planner's program (qk_gram hands it over) or NULL (built here). */
static qk_result qk__mps_cuda(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, const qk_cuda_io *io,
                              int nt, const qk__mps_prog *planned, char *err, size_t err_size)
{
    qk__mps_prog own;
    const qk__mps_prog *prog = NULL;
    qk_cuda_mps m;
    double *A = NULL, *B = NULL;
    int chi;
    qk_result r = qk__mps_prog_of(planned, map, desc, &own, &prog);
    if (r != QK_OK) return r;
    chi = qk__mps_gpu_chi(prog->chi);
    QK_PROF_BEGIN("mps states");
    A = qk__mps_gpu_states(prog, map, desc->x, desc->n_x, nt, chi, desc->mps_discarded);
    if (A && desc->y) B = qk__mps_gpu_states(prog, map, desc->y, desc->n_y, nt, chi, desc->mps_discarded ? desc->mps_discarded + desc->n_x : NULL);
    QK_PROF_END("mps states");
    if (!A || (desc->y && !B)) r = QK_ERROR_OUT_OF_MEMORY;
    else {
        memset(&m, 0, sizeof m);
        m.n_sites = prog->q;
        m.chi = chi;
        m.a = A;
        m.n_a = desc->n_x;
        m.b = B;
        m.n_b = desc->y ? desc->n_y : 0;
        r = qk_cuda_mps_gram(plan, desc, &m, io, err, err_size);
    }
    QK_FREE(A);
    QK_FREE(B);
    qk__mps_prog_free(&own);
    return r;
}

/* The context's two page-locked staging buffers (ctx->stage), grown to at least need bytes each:
   1 when they hold that much; a failure to grow leaves none (0: the caller copies without them). */
QK__PRIV int qk__ctx_stage(qk_ctx *ctx, size_t need)
{
    char err[256];
    if (ctx->stage_bytes >= need) return 1;
    qk_cuda_host_free(ctx->stage[0]);
    qk_cuda_host_free(ctx->stage[1]);
    ctx->stage[0] = ctx->stage[1] = NULL;
    ctx->stage_bytes = 0;
    if (qk_cuda_host_alloc(need, &ctx->stage[0], err, sizeof err) == QK_OK && qk_cuda_host_alloc(need, &ctx->stage[1], err, sizeof err) == QK_OK)
        ctx->stage_bytes = need;
    else {
        qk_cuda_host_free(ctx->stage[0]);
        qk_cuda_host_free(ctx->stage[1]);
        ctx->stage[0] = ctx->stage[1] = NULL;
    }
    return ctx->stage_bytes >= need;
}

/* The context's stream pool of its k-th GPU (the current one), made on the first job there; NULL
   when it cannot be made (the job then makes its own streams, as the pool's absence means). */
QK__PRIV qk_cuda_pool *qk__cuda_pool(qk_ctx *ctx, int k)
{
    char err[256];
    if (!ctx->spool[k] && qk_cuda_pool_create(&ctx->spool[k], err, sizeof err) != QK_OK) ctx->spool[k] = NULL;
    return ctx->spool[k];
}

/* A provider's rows for the GPU engine (qk_cuda_io.fetch): rows [r0, r1) of the Gram's x (tag 0)
   or y (tag 1) from qk_gram_states' provider (user: its map, a qk__smap, whose tags give the
   side and first row: qk_gram_mpi_states points them at a block of K), written into dst in
   chunks of at most the map's chunk rows, and checked as the CPU engine checks them. */
static qk_result qk__states_fetch(int tag, int64_t r0, int64_t r1, double *dst, void *user)
{
    qk__smap *sm = (qk__smap *)user;
    const int64_t rowb = (int64_t)sm->map.n_features * 8;
    const int side = sm->tag_side[tag];
    int64_t c;
    r0 += sm->tag_row0[tag];
    r1 += sm->tag_row0[tag];
    for (c = r0; c < r1; c += sm->chunk) {
        const int64_t k = r1 - c < sm->chunk ? r1 - c : sm->chunk;
        const qk_result r = qk__smap_fetch(sm, side, c, k, (char *)dst + (size_t)((c - r0) * rowb));
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* A planned Gram on the GPU engine (one GPU) into the sink, with qk.h's delivery (pageable host
   copy-out, square tiles for the callback, the .npy stream). mps: the planner's MPS program
   (MPS path; NULL: built here). */
QK__PRIV qk_result qk__cuda_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *mps, qk_cuda_stats *stats)
{
    char err[512] = "";
    qk__deliver d;
    qk_cuda_io io;
    qk_result r;
    const int n_threads = ctx ? ctx->desc.n_threads : 0;
    memset(&d, 0, sizeof d);
    d.desc = desc;
    d.sink = sink;
    d.cols = plan->n_y;
    d.es = sink->es;
    d.ld_dst = sink->ld;
    d.n_threads = n_threads > 0 ? n_threads : qk__ncores();
    memset(&io, 0, sizeof io);
    io.rows = qk__deliver_rows;
    io.rows_user = &d;
    io.stats = stats;
    io.prof = QK__PROF_CUDA_HOOKS;
    io.pool = ctx ? qk__cuda_pool(ctx, 0) : NULL;
    if (qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_PROVIDER)) {
        io.fetch = qk__states_fetch;
        io.fetch_user = (void *)(uintptr_t)(const void *)map;   /* the map is its qk__smap's first member */
    }
    if (ctx && desc->output != QK_OUTPUT_DEVICE && !(desc->output == QK_OUTPUT_HOST && plan->host_pinned)) {
        /* the context's pinned staging, grown to this plan's slab (a failure here only means the
           engine allocates its own) */
        size_t need = (size_t)(plan->slab_rows > 0 ? plan->slab_rows : plan->n_x) * (size_t)plan->n_y * d.es;
        if (qk__ctx_stage(ctx, need)) {
            io.stage[0] = ctx->stage[0];
            io.stage[1] = ctx->stage[1];
            io.stage_bytes = ctx->stage_bytes;
        }
    }
    if (plan->path == QK_PATH_MPS) {   /* the MPS path: MPS built on the host, contracted on the GPU */
        r = qk__mps_cuda(plan, map, desc, &io, d.n_threads, mps, err, sizeof err);
    } else {
        r = qk_cuda_gram(plan, map, desc, &io, err, sizeof err);
    }
    if (r != QK_OK && err[0]) qk__fail(r, "%s", err);
    return r;
}
#endif

/* ---- several GPUs in one process ---- */
/* A plan with n_devices > 1 (qk_plan_for_devices) runs here: one host thread per GPU (the
   calling thread for the first, the context's GPU pool for the others) makes its GPU current
   and runs qk_cuda_gram on its parts of K (qk_plan.dev_row0: for K(X,Y) its rows x
   all columns; for K(X,X) the band's diagonal block, a symmetric job, then the rectangle right
   of it), each part with the plan qk_plan.parts carries for it (planned for that GPU's free
   memory and autotuned by qk_plan_make: nothing is planned or tuned here). Parts go to the output at their offsets
   in K, and no element is written by two threads (a band's rows from its first row on, and the
   mirror of its rectangle: rows below the band, the band's columns):
     HOST      the engine writes into the caller's buffer at the part's offset (D2H straight
               into it when it is pinned, else slab rows copied from pinned staging by the
               GPU's share of the host threads); the rectangle's mirror comes from the engine
               too, each slab's transpose made on the GPU (qk_cuda_io.mirror_out: D2H into
               its place; staged: qk_cuda_io.mrows, rows of it copied into their place)
     DEVICE    out_devices[k] on GPU k, rows of its band (qk_gram_desc.out_devices)
     CALLBACK  the caller's tiles in K's coordinates, one call at a time (a mutex)
     NPY       the sink's temporary file; each thread writes through its own descriptor the
               row pieces of its slabs and of their transposes (mrows, as for HOST); the
               writer's syncer is the one-GPU path's, commit and removal qk_gram's
   The first failure (a GPU error, a write error, a cancel) sets a flag that every other thread
   reads before each slab and each write; the job then returns that failure, naming the GPU, and
   NPY leaves no file. Times: qk_ctx_device_seconds. */
#if defined(QK_CUDA) && QK_CUDA
static int qk__mgpu_test_fail = -1;  /* tests: this ordinal's thread fails before its last part */
#ifdef QK_TEST_FAULTS
static int64_t qk__mgpu_test_slab = 0;   /* tests: > 0, every part runs in slabs of this many rows (K not resident) */
static qk_plan qk__mgpu_test_ran[QK_MAX_PARTS];   /* tests: the plan each part of the last job ran */
#endif

typedef struct qk__mgpu {
    qk_ctx *ctx;
    const qk_plan *plan;
    const qk_map *map;
    const qk_gram_desc *desc;
    qk__sink *sink;
    qk__npyw *w;                /* NPY: the sink's writer */
    int64_t cols, ld;
    size_t es;
    int cancel;                 /* the first failure sets it; every thread stops */
    int64_t done, total;        /* entries of K delivered (progress), under mu */
    double t0;
    qk__mutex mu;               /* the caller's callbacks one at a time; the first failure */
    qk_result r;                /* the first failure and its detail */
    char err[sizeof qk__errbuf];
    struct qk__mgpu_dev *v;     /* the GPUs' shares, n_dev of them */
    int n_dev, serial;          /* shares [serial, n_dev) run on the calling thread after the first */
} qk__mgpu;

typedef struct qk__mgpu_dev {
    qk__mgpu *g;
    int k, ord;
    int caller;                 /* its share runs on the calling thread (not named, qk gpu <ordinal>) */
    int fd;                     /* NPY: this thread's descriptor of the temporary file */
    int64_t di, dj, h, w;       /* the running part: origin in K, rows, columns */
    int diag, mirror;
    int64_t last;               /* the part's progress reported so far */
    qk__deliver copy;           /* HOST: slab rows into the caller's buffer on this GPU's share of the host threads */
    qk_cuda_stats stats;        /* its last part's, copyin_bytes summed over its parts */
    double seconds;
} qk__mgpu_dev;

static void qk__mgpu_lock(qk__mgpu *g)
{
    qk__mutex_lock(&g->mu);
}

static void qk__mgpu_unlock(qk__mgpu *g)
{
    qk__mutex_unlock(&g->mu);
}

/* Records a failure (the first one wins; a thread stopped by the flag does not count) and stops
   every thread. user: the caller's callback cancelled (no device named). */
static void qk__mgpu_fail(qk__mgpu *g, int ord, qk_result r, const char *detail, int user)
{
    qk__mgpu_lock(g);
    if (g->r == QK_OK && !(r == QK_ERROR_CANCELLED && !user && QK__LOAD(&g->cancel))) {
        g->r = r;
        if (user) snprintf(g->err, sizeof g->err, "%s", detail);
        else snprintf(g->err, sizeof g->err, "CUDA device %d: %s", ord, detail);
    }
    QK__STORE(&g->cancel, 1);
    qk__mgpu_unlock(g);
}

static int qk__mgpu_progress(int64_t done, int64_t total, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    int stop = 0;
    QK__UNUSED(total);
    if (QK__LOAD(&g->cancel)) return 1;
    if (g->desc->progress) {
        /* entries of K the part stands for: a rectangle's twice (its mirror); a band's rows of w
           (done counts whole rows) its h x h block and twice the rectangle right of it */
        int64_t add = (done - v->last) * (v->mirror ? 2 : 1);
        if (v->diag && v->w > v->h) add = (done / v->w - v->last / v->w) * (2 * v->w - v->h);
        v->last = done;
        qk__mgpu_lock(g);
        g->done += add;
        stop = g->desc->progress(g->done, g->total, g->desc->progress_user);
        qk__mgpu_unlock(g);
        if (stop) {
            qk__mgpu_fail(g, v->ord, QK_ERROR_CANCELLED, "progress callback cancelled the Gram", 1);
            return 1;
        }
    }
    return 0;
}

/* The engine's host-side slab rows [i0, i0 + m) of the running part to the caller's output. */
static qk_result qk__mgpu_rows(int64_t i0, int64_t m, const void *rows, int64_t ld, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    const qk__sink *sink = g->sink;
    const size_t es = g->es;
    const char *src = (const char *)rows;
    const int64_t gi = v->di + i0;
    int64_t a;
    if (QK__LOAD(&g->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (sink->kind == QK_OUTPUT_HOST) {
        v->copy.cols = v->w;
        qk__deliver_host(&v->copy, (char *)sink->out + (size_t)(gi * g->ld + v->dj) * es, m, src, ld);
        return QK_OK;
    }
    if (sink->kind == QK_OUTPUT_CALLBACK) {
        int64_t j0;
        int stop = 0;
        qk__mgpu_lock(g);
        for (j0 = v->diag ? i0 : 0; j0 < v->w && !stop; j0 += m) {
            const int64_t n = v->w - j0 < m ? v->w - j0 : m;
            stop = sink->tile_fn(gi, v->dj + j0, m, n, src + (size_t)j0 * es, ld, sink->tile_user);
        }
        qk__mgpu_unlock(g);
        if (stop) {
            qk__mgpu_fail(g, v->ord, QK_ERROR_CANCELLED, "tile callback cancelled the Gram", 1);
            return qk__fail(QK_ERROR_CANCELLED, "tile callback cancelled the Gram");
        }
        return QK_OK;
    }
    for (a = 0; a < m; a++) {
        qk_result r = qk__npyw_at_fd(g->w, v->fd, ((uint64_t)(gi + a) * (uint64_t)g->cols + (uint64_t)v->dj) * es,
                                     src + (size_t)(a * ld) * es, (size_t)v->w * es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* The engine's transpose of the running rectangle's slab rows [i0, i0 + m) (qk_cuda_io.mrows:
   w rows of m entries, ld apart): the mirror below the diagonal, K[dj + c][di + i0 + a], copied
   into its place as rows (HOST: on the GPU's share of the host threads; NPY: a write a row). */
static qk_result qk__mgpu_mrows(int64_t i0, int64_t m, const void *t, int64_t ld, void *user)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)user;
    qk__mgpu *g = v->g;
    const size_t es = g->es;
    const int64_t gi = v->di + i0;
    int64_t c;
    if (QK__LOAD(&g->cancel)) return qk__fail(QK_ERROR_CANCELLED, "cancelled");
    if (g->sink->kind == QK_OUTPUT_HOST) {
        v->copy.cols = m;
        qk__deliver_host(&v->copy, (char *)g->sink->out + (size_t)(v->dj * g->ld + gi) * es, v->w, t, ld);
        return QK_OK;
    }
    for (c = 0; c < v->w; c++) {
        qk_result r = qk__npyw_at_fd(g->w, v->fd, ((uint64_t)(v->dj + c) * (uint64_t)g->cols + (uint64_t)gi) * es,
                                     (const char *)t + (size_t)(c * ld) * es, (size_t)m * es);
        if (r != QK_OK) return r;
    }
    return QK_OK;
}

/* One GPU's share: its parts in order, each with the plan the plan carries for it. */
static void *qk__mgpu_main(void *p)
{
    qk__mgpu_dev *v = (qk__mgpu_dev *)p;
    qk__mgpu *g = v->g;
    qk_ctx *ctx = g->ctx;
    const qk_plan *plan = g->plan;
    const qk_gram_desc *desc = g->desc;
    int i, n_parts = 0, done = 0;
    char err[512] = "", nm[32];
    qk_result r;
    qk_map pm;
    qk_op pop;
    /* device states: read in place on the first GPU, copied in from it on the others */
    const qk_map *map = qk__map_for_device(g->map, v->k, &pm, &pop);
    double copyin = 0.0;
    for (i = 0; i < plan->n_parts; i++) n_parts += plan->parts[i].device == v->k;
    snprintf(nm, sizeof nm, "qk gpu %d", v->ord);
    if (!v->caller) QK_PROF_THREAD_NAME(nm);
    QK__UNUSED(nm);
    QK_PROF_BEGIN("qk gpu share");
    r = qk_cuda_set_device(v->ord, err, sizeof err);
    if (r != QK_OK) qk__mgpu_fail(g, v->ord, r, err, 0);
    for (i = 0; i < plan->n_parts && r == QK_OK && !QK__LOAD(&g->cancel); i++) {
        const qk_plan_part *pp = &plan->parts[i];
        const int64_t j0 = pp->col0;
        qk_gram_desc sd;
        qk_plan sp;
        qk_cuda_io io;
        if (pp->device != v->k) continue;
        err[0] = 0;
        if (qk__mgpu_test_fail == v->ord && done == n_parts - 1) {
            r = QK_ERROR_CUDA;
            qk__mgpu_fail(g, v->ord, r, "an injected failure (test) before its last part", 0);
            break;
        }
        done++;
        /* the part's job and plan, both as the planner made them (qk__mgpu_part_desc, plan.parts) */
        qk__mgpu_part_desc(plan, pp, g->map->n_features, desc, &sd);
        qk__plan_part_plan(plan, i, ctx->dev_ord[v->k] == v->ord ? ctx->dev_info[v->k].name : NULL, &sp);
        sd.tile_fn = desc->tile_fn;
        sd.tile_user = desc->tile_user;
        sd.out_path = desc->out_path;
        sd.no_sync = 1;
        sd.progress = qk__mgpu_progress;
        sd.progress_user = v;
        if (desc->output == QK_OUTPUT_HOST) {
            sd.out = (char *)desc->out + (size_t)(pp->row0 * g->ld + j0) * g->es;
            sd.ld_out = g->ld;
        } else if (desc->output == QK_OUTPUT_DEVICE) {
            sd.out = (char *)desc->out_devices[v->k] + (size_t)j0 * g->es;
            sd.ld_out = g->ld;
        }
#ifdef QK_TEST_FAULTS
        memcpy(&qk__mgpu_test_ran[i], &sp, sizeof sp);   /* byte for byte: tests compare with memcmp */
#endif
#ifdef QK_TEST_FAULTS
        if (qk__mgpu_test_slab > 0 && sp.n_x > qk__mgpu_test_slab) {
            sp.tile_m = sp.slab_rows = qk__mgpu_test_slab;
            sp.k_resident = 0;
        }
#endif
        memset(&io, 0, sizeof io);
        io.rows = qk__mgpu_rows;
        io.rows_user = v;
        io.stats = &v->stats;
        io.prof = QK__PROF_CUDA_HOOKS;
        io.pool = qk__cuda_pool(ctx, v->k);
        if (pp->symmetric && pp->n_cols > pp->n_rows) io.band_rows = pp->n_rows;   /* a band: one call from the diagonal to n */
        if (pp->mirror && desc->output == QK_OUTPUT_HOST && sp.host_pinned) {   /* the mirror: D2H into its place */
            io.mirror_out = (char *)desc->out + (size_t)(j0 * g->ld + pp->row0) * g->es;
            io.mirror_ld = g->ld;
        } else if (pp->mirror && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY)) {
            io.mrows = qk__mgpu_mrows;   /* staged: a slab and its transpose per staging slot */
            io.mrows_user = v;
        }
        if (desc->output != QK_OUTPUT_DEVICE && !(desc->output == QK_OUTPUT_HOST && sp.host_pinned)) {
            size_t need = (size_t)(sp.slab_rows > 0 ? sp.slab_rows : sp.n_x) * (size_t)sp.n_y * g->es * (io.mrows ? 2 : 1);
            if (ctx->dstage_bytes[v->k] < need) {
                char e2[256];
                qk_cuda_host_free(ctx->dstage[v->k][0]);
                qk_cuda_host_free(ctx->dstage[v->k][1]);
                ctx->dstage[v->k][0] = ctx->dstage[v->k][1] = NULL;
                ctx->dstage_bytes[v->k] = 0;
                if (qk_cuda_host_alloc(need, &ctx->dstage[v->k][0], e2, sizeof e2) == QK_OK &&
                    qk_cuda_host_alloc(need, &ctx->dstage[v->k][1], e2, sizeof e2) == QK_OK)
                    ctx->dstage_bytes[v->k] = need;
            }
            if (ctx->dstage_bytes[v->k] >= need) {
                io.stage[0] = ctx->dstage[v->k][0];
                io.stage[1] = ctx->dstage[v->k][1];
                io.stage_bytes = ctx->dstage_bytes[v->k];
            }
        }
        v->di = pp->row0;
        v->dj = j0;
        v->h = pp->n_rows;
        v->w = pp->n_cols;
        v->diag = pp->symmetric;
        v->mirror = pp->mirror;
        v->last = 0;
        err[0] = 0;
        r = qk_cuda_gram(&sp, map, &sd, &io, err, sizeof err);
        if (r == QK_OK) {
            copyin += v->stats.copyin_bytes;
            v->stats.copyin_bytes = copyin;
        }
        if (r != QK_OK) {
            if (!err[0]) snprintf(err, sizeof err, "%s", qk__errbuf);
            qk__mgpu_fail(g, v->ord, r, err, 0);
        }
    }
    v->seconds = qk_cuda_wtime() - g->t0;
    QK_PROF_END("qk gpu share");
    return NULL;
}

/* Share t of the context's GPU pool (qk__tpool_run): the calling thread (t = 0) runs the first
   GPU's share, then those no worker took; worker t the share of GPU t. */
static void qk__mgpu_work(void *p, int t)
{
    qk__mgpu *g = (qk__mgpu *)p;
    int k;
    if (t > 0) {
        if (t < g->serial) (void)qk__mgpu_main(&g->v[t]);
        return;
    }
    g->v[0].caller = 1;
    (void)qk__mgpu_main(&g->v[0]);
    for (k = g->serial; k < g->n_dev; k++) {
        g->v[k].caller = 1;
        (void)qk__mgpu_main(&g->v[k]);
    }
}

QK__PRIV qk_result qk__mgpu_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink)
{
    qk__mgpu g;
    qk__mgpu_dev v[QK_MAX_DEVICES];
    const int n = plan->n_devices;
    int k;
    qk_result r = QK_OK;
    if (n < 2 || n > QK_MAX_DEVICES) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of %d devices (internal error)", n);
    r = qk__mgpu_check_parts(plan);   /* the plan carries every part's plan: nothing is planned here */
    if (r != QK_OK) return r;
    if (desc->output == QK_OUTPUT_DEVICE) {
        if (!desc->out_devices)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: output DEVICE on %d GPUs needs desc->out_devices (one buffer per GPU, "
                            "rows plan.dev_row0[k] .. dev_row0[k+1] from qk_plan_make), or a context of one GPU (n_cuda_devices = 1)", n);
        for (k = 0; k < n; k++)
            if (!desc->out_devices[k]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: out_devices[%d] (CUDA device %d) is NULL", k, plan->devices[k]);
    }
    memset(&g, 0, sizeof g);
    memset(v, 0, sizeof v);
    g.ctx = ctx;
    g.plan = plan;
    g.map = map;
    g.desc = desc;
    g.sink = sink;
    g.w = &sink->npy;
    g.cols = plan->n_y;
    g.ld = desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_DEVICE ? (desc->ld_out ? desc->ld_out : plan->n_y) : plan->n_y;
    g.es = plan->out_dtype == QK_F32 ? 4 : 8;
    g.total = plan->n_x * plan->n_y;
    if (qk__mutex_init(&g.mu) != 0) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram: cannot create a mutex");
    if (sink->kind == QK_OUTPUT_NPY) sink->npy.cancel = &g.cancel;
    for (k = 0; k < n; k++) {
        const int nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
        v[k].g = &g;
        v[k].k = k;
        v[k].ord = plan->devices[k];
        v[k].fd = -1;
        v[k].copy.es = g.es;
        v[k].copy.ld_dst = g.ld;
        v[k].copy.n_threads = nt / n > 1 ? nt / n : 1;   /* the host's threads shared between the GPUs */
        if (r == QK_OK && sink->kind == QK_OUTPUT_NPY) r = qk__npyw_fd(&sink->npy, &v[k].fd);
    }
    /* The GPUs' host threads: the calling thread runs the first GPU's share, the context's GPU
       pool (started once, one worker a further GPU) the others'. A thread started per GPU and
       call, and joined, slowed the short 2-GPU calls (docs/benchmarks.md, "The GPUs' host
       threads"). A share no worker takes (threads that could not start, or none: QK_NO_THREADS)
       runs on the calling thread after the first. The pool's spin: the first GPU's thread
       yields a few ms for the others before it sleeps. */
    if (r == QK_OK) (void)qk__ctx_pool_of(ctx, &ctx->gpool, ctx->n_dev, 4096);
    g.v = v;
    g.n_dev = n;
    g.serial = ctx->gpool ? (ctx->gpool->n_workers + 1 < n ? ctx->gpool->n_workers + 1 : n) : 1;
    g.t0 = qk_cuda_wtime();
    if (r == QK_OK) {
        if (ctx->gpool) qk__tpool_run(ctx->gpool, g.serial, qk__mgpu_work, &g);
        else qk__mgpu_work(&g, 0);
    }
    if (r == QK_OK && g.r != QK_OK) r = qk__fail(g.r, "%s", g.err);
    for (k = 0; k < n; k++) {
        if (v[k].fd >= 0) (void)QK__CLOSE(v[k].fd);
    }
    if (sink->kind == QK_OUTPUT_NPY) sink->npy.cancel = NULL;   /* g ends here; qk_gram commits or discards */
    qk__mutex_destroy(&g.mu);
    ctx->cuda_stats = v[0].stats;
    ctx->n_dev_last = n;
    for (k = 0; k < n; k++) {
        ctx->dev_seconds[k] = v[k].seconds;
        ctx->dev_stats[k] = v[k].stats;
    }
    {   /* later calls on this thread run on the context's first GPU, as with one */
        char e2[64];
        (void)qk_cuda_set_device(plan->devices[0], e2, sizeof e2);
    }
    return r;
}
#endif /* QK_CUDA */
/* ---- end several GPUs ---- */

/* >>gram_impl ---- qk_gram and qk_states: validate, plan, open the sink, hand plan + sink to the executor ---- */
#include <float.h>
/* Runs a made plan: opens the sink of its output (qk__sink_open: the caller's buffer or callback,
   or the .npy's temporary file), hands plan and sink to the executor the plan names (the CPU
   engine, the MPS engine, the GPU engine on one GPU or several), and closes the sink with the
   executor's result (commit, or the temporary removed). The one place a Gram's output is opened
   and committed. qk_gram after validating and planning; tests and qk-bench with injected plans
   (ctx may be NULL there: no context staging, no figures kept). mps: the planner's MPS program
   of an MPS plan (qk__plan_make's keep), which the engines then do not build again; NULL: they
   build it from the map. */
static qk_result qk__plan_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc,
                              const qk__mps_prog *mps)
{
    qk__sink sink;
    qk_result r;
#if defined(QK_CUDA) && QK_CUDA
    qk_gram_desc d1;
    if (plan->backend == QK_BACKEND_CUDA && plan->n_devices <= 1 && desc->output == QK_OUTPUT_DEVICE && !desc->out && desc->out_devices) {
        d1 = *desc;   /* one GPU: out_devices[0] is the buffer */
        d1.out = desc->out_devices[0];
        desc = &d1;
    }
#endif
    if (plan->backend == QK_BACKEND_CUDA) {
#if !(defined(QK_CUDA) && QK_CUDA)
        QK__UNUSED(ctx);
        return qk__fail(QK_ERROR_NO_DEVICE, "no CUDA engine in this build");
#endif
    }
    if (desc->mps_discarded && plan->path != QK_PATH_MPS)
        memset(desc->mps_discarded, 0, sizeof(double) * (size_t)(desc->n_x + (desc->y ? desc->n_y : 0)));
    r = qk__sink_open(&sink, plan, desc);
    if (r != QK_OK) return r;
#if defined(QK_CUDA) && QK_CUDA
    if (plan->backend == QK_BACKEND_CUDA) {
        qk_cuda_stats st;
        if (ctx) {
            memset(&ctx->cuda_stats, 0, sizeof ctx->cuda_stats);
            ctx->n_dev_last = 0;
        }
        if (plan->n_devices > 1) r = ctx ? qk__mgpu_run(ctx, plan, map, desc, &sink)
                                         : qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of several GPUs needs a context");
        else {
            double t0 = qk_cuda_wtime();
            r = qk__cuda_run(ctx, plan, map, desc, &sink, mps, ctx ? &ctx->cuda_stats : &st);
            if (ctx) {
                ctx->n_dev_last = 1;
                ctx->dev_seconds[0] = qk_cuda_wtime() - t0;
            }
        }
        return qk__sink_close(&sink, r);
    }
#endif
    if (plan->path == QK_PATH_MPS) r = qk__mps_gram(plan, map, desc, &sink, mps);
    else r = qk__cpu_gram(plan, map, desc, &sink);
    return qk__sink_close(&sink, r);
}

static qk_result qk__gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc)
{
    qk_plan plan;
    qk__mps_prog prog;   /* the planner's MPS program (MPS plans), handed to the engine */
    qk_result r;
    QK_PROF_BEGIN("validate");
    r = qk__check_gram(ctx, map, desc);
    QK_PROF_END("validate");
    if (r != QK_OK) return r;
    memset(&prog, 0, sizeof prog);
    QK_PROF_BEGIN("plan");
    r = qk__plan_make(ctx, map, desc, &plan, &prog);
    QK_PROF_END("plan");
    if (r == QK_OK) r = qk__plan_run(ctx, &plan, map, desc, &prog);
    qk__mps_prog_free(&prog);
    return r;
}

QKDEF qk_result qk_gram(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc)
{
    qk_result r;
    qk__tpool *outer = qk__cur_pool;
    if (ctx) qk__cur_pool = qk__ctx_pool(ctx);   /* started once; without it every step starts its own threads */
    QK_PROF_BEGIN("qk_gram");
    r = qk__gram(ctx, map, desc);
    QK_PROF_END("qk_gram");
    qk__cur_pool = outer;
    return r;
}

QKDEF qk_result qk_states(qk_ctx *ctx, const qk_map *map, const double *x, int64_t n, double *out)
{
    qk_result r;
    double *s;
    int64_t D, i, k;
    qk_path path;
    if (!ctx || !map || !x || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_states: NULL %s", !ctx ? "ctx" : !map ? "map" : !x ? "x" : "out");
    if (map->n_qubits > QK_MAX_STATE_QUBITS) return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "qk_states: %d qubits exceed the state limit %d", map->n_qubits, QK_MAX_STATE_QUBITS);
    r = qk_map_check_data(map, x, n, "X");
    if (r != QK_OK) return r;
    path = map->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
    s = qk__cpu_states(map, x, 0, n, path, ctx->desc.n_threads, NULL);
    if (!s) return QK_ERROR_OUT_OF_MEMORY;
    D = (int64_t)1 << map->n_qubits;
    for (i = 0; i < n; i++) {
        const double *row = s + i * qk__row_len(map, path);
        for (k = 0; k < D; k++) {
            out[2 * (i * D + k)] = row[k];
            out[2 * (i * D + k) + 1] = path == QK_PATH_REAL ? 0.0 : row[D + k];
        }
    }
    QK_FREE(s);
    return QK_OK;
}



/* ---- qk_gram_states: K from given states ---- */
#if defined(QK_CUDA) && QK_CUDA
/* Device states (on_device): their norms computed on the device, checked as host rows are. */
static qk_result qk__states_check_device(const qk__smap *sm, const void *x, int64_t n, int64_t ld_doubles, int side)
{
    double *nrm = (double *)qk__malloc(sizeof(double) * (size_t)n * ((sm->op.q1 & QK__STATE_MIXED) ? 3 : 1));
    char err[256] = "";
    qk_result r;
    int64_t i;
    if (!nrm) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld norms", sm->fn, (long long)n);
    if (sm->op.q1 & QK__STATE_MIXED) {
        /* density matrices: trace, Hermiticity and largest entry per matrix on the device, checked
           as host ones are */
        const char *nm = side ? "B" : "A";
        r = qk_cuda_state_dm_check(x, n, ld_doubles, (int)sm->in.type, sm->in.dim, nrm, err, sizeof err);
        if (r != QK_OK) qk__fail(r, "%s: %s: %s", sm->fn, side ? "b" : "a", err);
        for (i = 0; i < n && r == QK_OK; i++) {
            const double tr = nrm[3 * i], dev = nrm[3 * i + 1], mx = nrm[3 * i + 2];
            char v0[40], v1[40];
            if (isnan(tr)) r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: an entry of the density matrix is NaN or Inf", nm, (long long)i);
            else if (!(dev <= sm->in.norm_tol))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix is not Hermitian: an entry differs from the conjugate of "
                             "its transpose's by %s, more than norm_tol %s", nm, (long long)i, qk__fmt_g(v0, sizeof v0, dev, 3),
                             qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
            else if (!(tr > DBL_MIN))
                r = qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the density matrix's trace is %s (not positive)", nm, (long long)i,
                             qk__fmt_g(v0, sizeof v0, tr, 17));
            else if (!(mx <= tr * (1.0 + sm->in.norm_tol)))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: an entry of the density matrix has magnitude %s, more than its trace %s: "
                             "not a density matrix (a positive matrix's entries are at most its trace)", nm, (long long)i,
                             qk__fmt_g(v0, sizeof v0, mx, 6), qk__fmt_g(v1, sizeof v1, tr, 6));
            else if ((sm->op.q1 & QK__STATE_NORMALIZE) == 0 && !(fabs(tr - 1.0) <= sm->in.norm_tol))
                r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the density matrix's trace is %s, off 1 by more than norm_tol %s "
                             "(normalize = 1 divides by it)", nm, (long long)i, qk__fmt_g(v0, sizeof v0, tr, 17),
                             qk__fmt_g(v1, sizeof v1, sm->in.norm_tol, 3));
        }
        QK_FREE(nrm);
        return r;
    }
    r = qk_cuda_state_norms(x, n, ld_doubles, (int)sm->in.type, sm->in.dim, nrm, err, sizeof err);
    if (r != QK_OK) qk__fail(r, "%s: %s: %s", sm->fn, side ? "b" : "a", err);
    for (i = 0; i < n && r == QK_OK; i++) r = qk__state_norm_check(sm, nrm[i], side, i);
    QK_FREE(nrm);
    return r;
}
#endif
/* Rows of n elements of esize bytes, ld apart, packed into a fresh buffer whose rows are a
   multiple of 8 bytes (ld_out elements): the engines move rows of whole doubles. */
static void *qk__states_pack(const void *src, int64_t n, int64_t dim, int64_t ld, int esize, int64_t ld_out)
{
    char *p;
    int64_t i;
    if ((double)n * (double)ld_out * esize > 9.0e18) return NULL;
    p = (char *)qk__calloc((size_t)(n * ld_out), (size_t)esize);
    if (!p) return NULL;
    for (i = 0; i < n; i++) memcpy(p + (size_t)(i * ld_out) * (size_t)esize, (const char *)src + (size_t)(i * ld) * (size_t)esize, (size_t)(dim * esize));
    return p;
}

/* n pure states (rows ld elements apart, dim amplitudes of type) as density matrices
   |psi><psi|, dim^2 elements of the same type, rows ld_out elements apart. */
static void *qk__states_outer(const void *src, int64_t n, int64_t dim, int64_t ld, qk_state_type type, int64_t ld_out)
{
    const int es = qk__state_esize(type);
    char *p;
    int64_t i, a, b;
    if ((double)n * (double)ld_out * es > 9.0e18) return NULL;
    p = (char *)qk__calloc((size_t)(n * ld_out), (size_t)es);
    if (!p) return NULL;
    for (i = 0; i < n; i++) {
        const char *row = (const char *)src + (size_t)(i * ld) * (size_t)es;
        char *o = p + (size_t)(i * ld_out) * (size_t)es;
        for (a = 0; a < dim; a++)
            for (b = 0; b < dim; b++) {
                double ar, ai, br, bi, re, im;
                qk__state_amp(row, (int)type, a, &ar, &ai);
                qk__state_amp(row, (int)type, b, &br, &bi);
                re = ar * br + ai * bi;   /* psi_a conj(psi_b) */
                im = ai * br - ar * bi;
                switch (type) {
                case QK_STATE_C128: { double v[2] = {re, im}; memcpy(o + (size_t)(a * dim + b) * 16, v, 16); break; }
                case QK_STATE_C64: { float v[2] = {(float)re, (float)im}; memcpy(o + (size_t)(a * dim + b) * 8, v, 8); break; }
                case QK_STATE_F64: memcpy(o + (size_t)(a * dim + b) * 8, &re, 8); break;
                default: { float v = (float)re; memcpy(o + (size_t)(a * dim + b) * 4, &v, 4); break; }
                }
            }
    }
    return p;
}

/* qk_gram_states' map and Gram desc (sm, *g) from the caller's; sm's packed copies and buffer
   to free (qk__smap_free, also after a failure: what is left is NULL). qk_gram_mpi_states too.
   fn: the entry point's name, which begins its messages (kept in sm->fn). */
QK__PRIV qk_result qk__smap_make(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, const char *fn, qk__smap *sm_out,
                                 qk_gram_desc *g_out)
{
#define sm (*sm_out)
#define g (*g_out)
    void *pa = NULL, *pb = NULL;
    int esize, q = 1;
    int64_t row_elems;   /* elements of a stored row: a multiple of 8 bytes */
    int64_t nel, nel_a, nel_b, vlen;
    int mixed;
    const char *what = NULL;
    memset(&sm, 0, sizeof sm);
    memset(&g, 0, sizeof g);
    sm.fn = fn;
    sm.tag_side[1] = 1;
    if (!ctx || !states || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, !ctx ? "ctx" : !states ? "states" : "desc");
    sm.in = *states;
    if (sm.in.type == QK_STATE_DEFAULT) sm.in.type = QK_STATE_C128;
    if ((int)sm.in.type < (int)QK_STATE_C128 || (int)sm.in.type > (int)QK_STATE_F32)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown state type %d", fn, (int)states->type);
    esize = qk__state_esize(sm.in.type);
    if (sm.in.dim < 2) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: dim must be >= 2 (got %lld)", fn, (long long)sm.in.dim);
    if ((sm.in.a_mixed != 0 && sm.in.a_mixed != 1) || (sm.in.b_mixed != 0 && sm.in.b_mixed != 1))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a_mixed and b_mixed must be 0 or 1", fn);
    mixed = sm.in.a_mixed || (sm.in.b_mixed && (sm.in.b || (sm.in.provider && sm.in.n_b > 0)));
    if (mixed && sm.in.dim > ((int64_t)1 << 16))
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%s: density matrices of dim %lld are too large", fn, (long long)sm.in.dim);
    nel = mixed ? sm.in.dim * sm.in.dim : sm.in.dim;   /* elements of a sample (a matrix: dim^2) */
    nel_a = sm.in.a_mixed || !mixed ? nel : sm.in.dim;
    /* K(A,A) has no B side: its rows are A's (a side of one kind: no expansion below) */
    nel_b = sm.in.b_mixed || !mixed || !(sm.in.b || (sm.in.provider && sm.in.n_b > 0)) ? nel : sm.in.dim;
    vlen = mixed ? nel * (qk__state_complex(sm.in.type) ? 2 : 1) : nel;   /* the engines' vector */
    while (q < 62 && ((int64_t)1 << q) < vlen) q++;
    if (q > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "%s: %s of dim %lld need%s %d qubits, beyond the state limit %d", fn,
                        mixed ? "density matrices" : "states", (long long)sm.in.dim, mixed ? "" : "s", q, QK_MAX_STATE_QUBITS);
    if (mixed && sm.in.provider && sm.in.a_mixed != sm.in.b_mixed && sm.in.n_b > 0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: a provider gives rows of one kind (a_mixed == b_mixed)", fn);
    if (desc->x || desc->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: desc->x and desc->y must be NULL (the states are states->a and states->b)", fn);
    if (sm.in.n_a <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_a must be > 0 (got %lld)", fn, (long long)sm.in.n_a);
    if ((sm.in.b || (sm.in.provider && sm.in.n_b)) && sm.in.n_b <= 0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_b must be > 0 with b (got %lld)", fn, (long long)sm.in.n_b);
    if (sm.in.provider && (sm.in.a || sm.in.b)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a provider, or a and b, not both", fn);
    if (!sm.in.provider && !sm.in.a) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a is NULL (and no provider)", fn);
    if (sm.in.provider && sm.in.on_device) return qk__fail(QK_ERROR_UNSUPPORTED, "%s: the provider writes host rows (on_device with a provider)", fn);
    if (sm.in.lda == 0) sm.in.lda = nel_a;
    if (sm.in.ldb == 0) sm.in.ldb = nel_b;
    if (sm.in.lda < nel_a || (sm.in.b && sm.in.ldb < nel_b))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: ld%s %lld < %lld, the elements of a sample", fn, sm.in.lda < nel_a ? "a" : "b",
                        (long long)(sm.in.lda < nel_a ? sm.in.lda : sm.in.ldb), (long long)(sm.in.lda < nel_a ? nel_a : nel_b));
    if (sm.in.normalize != 0 && sm.in.normalize != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: normalize must be 0 or 1 (got %d)", fn, sm.in.normalize);
    if (sm.in.norm_tol == 0.0) sm.in.norm_tol = esize == 16 || sm.in.type == QK_STATE_F64 ? 1e-9 : 1e-5;
    if (!(sm.in.norm_tol > 0.0 && sm.in.norm_tol < 1.0)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: norm_tol must be in (0, 1) (got %g)", fn, states->norm_tol);
    if (desc->path == QK_PATH_MPS || desc->path == QK_PATH_ANALYTIC)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given statevectors take the statevector path (path %s)", fn, desc->path == QK_PATH_MPS ? "MPS" : "ANALYTIC");
    if (sm.in.on_device) {
#if defined(QK_CUDA) && QK_CUDA
        if (ctx->desc.device != QK_DEVICE_CUDA) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device states need a context on the GPU engine", fn);
#else
        return qk__fail(QK_ERROR_NO_DEVICE, "%s: device states need the CUDA engine (not in this build)", fn);
#endif
    }
    /* a stored row: the caller's ld when its rows are whole doubles apart and a, b are aligned
       (read in place), else packed rows of dim elements rounded up to whole doubles */
    row_elems = (nel * esize + 7) / 8 * 8 / esize;
    if (!sm.in.provider && nel_a != nel_b && sm.in.on_device) {
#if defined(QK_CUDA) && QK_CUDA
        /* a pure device side against device matrices: the pure side expanded to |psi><psi| on
           the device (rows as the matrices' ld), then both sides read as device matrices */
        const int pure_b = nel_b != nel;
        const void *mat = pure_b ? sm.in.a : sm.in.b, *pure = pure_b ? sm.in.b : sm.in.a;
        const int64_t ldm = pure_b ? sm.in.lda : sm.in.ldb, ldp = pure_b ? sm.in.ldb : sm.in.lda, np = pure_b ? sm.in.n_b : sm.in.n_a;
        const int comp = sm.in.type == QK_STATE_C128 || sm.in.type == QK_STATE_F64 ? 8 : 4;   /* bytes of a real or imaginary part */
        char err[256] = "";
        qk_result r;
        if ((ldm * esize) % 8 != 0 || (uintptr_t)mat % 8 != 0)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device density matrices need 8-byte aligned rows (ld%s * %d bytes)", fn,
                            pure_b ? "a" : "b", esize);
        if ((uintptr_t)pure % (uintptr_t)comp != 0)
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: %s: device states must be aligned to their elements' %d-byte parts", fn,
                            pure_b ? "b" : "a", comp);
        r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r == QK_OK) r = qk_cuda_state_outer(pure, np, ldp * esize, (int)sm.in.type, sm.in.dim, ldm, &sm.dev_pure, err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "%s: %s: %s", fn, pure_b ? "b" : "a", err);
        if (pure_b) { sm.in.b = sm.dev_pure; sm.in.ldb = ldm; sm.in.b_mixed = 1; }
        else { sm.in.a = sm.dev_pure; sm.in.lda = ldm; sm.in.a_mixed = 1; }
        row_elems = ldm;
#endif
    } else if (!sm.in.provider && nel_a != nel_b) {
        /* a pure side against a mixed one: the pure side expanded to |psi><psi| (both packed) */
        const int pure_b = nel_b != nel;
        pa = pure_b ? qk__states_pack(sm.in.a, sm.in.n_a, nel, sm.in.lda, esize, row_elems)
                    : qk__states_outer(sm.in.a, sm.in.n_a, sm.in.dim, sm.in.lda, sm.in.type, row_elems);
        if (pa) pb = pure_b ? qk__states_outer(sm.in.b, sm.in.n_b, sm.in.dim, sm.in.ldb, sm.in.type, row_elems)
                            : qk__states_pack(sm.in.b, sm.in.n_b, nel, sm.in.ldb, esize, row_elems);
        if (!pa || !pb) { what = "the pure states expanded to density matrices"; goto oom; }
    } else if (!sm.in.provider) {
        const int fit_a = (sm.in.lda * esize) % 8 == 0 && ((uintptr_t)sm.in.a % 8) == 0;
        const int fit_b = !sm.in.b || ((sm.in.ldb * esize) % 8 == 0 && ((uintptr_t)sm.in.b % 8) == 0 && sm.in.ldb == sm.in.lda);
        if (fit_a && fit_b) row_elems = sm.in.lda;
        else if (sm.in.on_device) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: device states need 8-byte aligned rows, and lda == ldb", fn);
        else {
            pa = qk__states_pack(sm.in.a, sm.in.n_a, nel, sm.in.lda, esize, row_elems);
            if (pa && sm.in.b) pb = qk__states_pack(sm.in.b, sm.in.n_b, nel, sm.in.ldb, esize, row_elems);
            if (!pa || (sm.in.b && !pb)) { what = "a packed copy of the states"; goto oom; }
        }
    }
    sm.pa = pa;   /* from here a failure leaves them to qk__smap_free */
    sm.pb = pb;
    if ((double)row_elems * esize / 8.0 > 2147483647.0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: rows of %lld elements are too long", fn, (long long)row_elems);
    sm.q = q;
    sm.op.kind = QK__OP_STATE;
    sm.op.q0 = (int)sm.in.type;
    sm.op.q1 = (sm.in.normalize ? QK__STATE_NORMALIZE : 0) | (sm.in.provider ? QK__STATE_PROVIDER : 0) | (sm.in.on_device ? QK__STATE_DEVICE : 0) |
               (mixed ? QK__STATE_MIXED : 0);
    sm.op.angle.kind = QK_ARG_CONST;
    sm.op.angle.x0 = (int)sm.in.dim;
    sm.op.angle.scale = 1.0;
    sm.map.type = QK_MAP_CUSTOM;
    sm.map.cls = qk__state_complex(sm.in.type) && !mixed ? QK_CLASS_COMPLEX : QK_CLASS_REAL;
    sm.map.n_qubits = q;
    sm.map.n_features = (int)(row_elems * esize / 8);
    sm.map.n_ops = 1;
    sm.map.ops = &sm.op;
    sm.map.desc.type = QK_MAP_CUSTOM;
    sm.map.desc.n_features = sm.map.n_features;
    sm.map.desc.n_qubits = q;
    g = *desc;
    g.n_x = sm.in.n_a;
    g.n_y = sm.in.n_b;
    if (sm.in.provider) {
        /* chunks of provider rows of at most 64 MB (at least one row) */
        sm.ld = row_elems;
        sm.chunk = (int64_t)(((size_t)64 << 20) / (size_t)(row_elems * esize));
        if (sm.chunk < 1) sm.chunk = 1;
        if (sm.chunk > (sm.in.n_a > sm.in.n_b ? sm.in.n_a : sm.in.n_b)) sm.chunk = sm.in.n_a > sm.in.n_b ? sm.in.n_a : sm.in.n_b;
        sm.buf = qk__calloc((size_t)(sm.chunk * row_elems), (size_t)esize);
        if (!sm.buf) { what = "the provider's row buffer"; goto oom; }
        g.x = (const double *)(const void *)&sm.side[0];
        g.y = sm.in.n_b > 0 ? (const double *)(const void *)&sm.side[1] : NULL;
        /* one GPU: the provider is called from one thread at a time (qk_state_fn) */
        g.mgpu_min_pairs = INT64_MAX;
        g.mgpu_host_bound_split = -1;
    } else {
        g.x = (const double *)(pa ? pa : sm.in.a);
        g.y = sm.in.b ? (const double *)(pb ? pb : sm.in.b) : NULL;
    }
#if defined(QK_CUDA) && QK_CUDA
    if (sm.in.on_device) {
        /* checked on the device, once: on the context's first GPU, where the states must live.
           Several GPUs split the job as for host states (the first reads the rows in place, the
           others copy them in from it: qk__map_for_device), except for device output into one
           buffer (desc->out without out_devices), which one GPU fills as before. */
        char err[256] = "";
        qk_result r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r != QK_OK) return qk__fail(r, "%s: %s", fn, err);
        r = qk__states_check_device(&sm, sm.in.a, sm.in.n_a, sm.map.n_features, 0);
        if (r == QK_OK && sm.in.b) r = qk__states_check_device(&sm, sm.in.b, sm.in.n_b, sm.map.n_features, 1);
        if (r != QK_OK) return r;
        if (desc->output == QK_OUTPUT_DEVICE && !desc->out_devices) {
            g.mgpu_min_pairs = INT64_MAX;
            g.mgpu_host_bound_split = -1;
        }
    }
#endif
    if (!g.y) g.n_y = 0;
    return QK_OK;
oom:
    QK_FREE(pa);
    QK_FREE(pb);
    QK_FREE(sm.buf);
    sm.pa = sm.pb = sm.buf = NULL;
    return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %s", fn, what);
#undef sm
#undef g
}

QK__PRIV void qk__smap_free(qk__smap *sm)
{
    QK_FREE(sm->pa);
    QK_FREE(sm->pb);
    QK_FREE(sm->buf);
#if defined(QK_CUDA) && QK_CUDA
    qk_cuda_dev_free(sm->dev_pure);
    sm->dev_pure = NULL;
#endif
}

/* The Gram of given states' map (plan NULL), or its plan: qk_gram_states, qk_plan_states; and
   for given MPS (qk__mps_states_run) */
static qk_result qk__gram_or_plan(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *g, qk_plan *plan)
{
    return plan ? qk_plan_make(ctx, map, g, plan) : qk_gram(ctx, map, g);
}

static qk_result qk__states_run(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, qk_plan *plan)
{
    qk__smap sm;
    qk_gram_desc g;
    qk_result r = qk__smap_make(ctx, states, desc, "qk_gram_states", &sm, &g);
#if defined(QK_CUDA) && QK_CUDA
    /* host states on the GPU engine: page-locked for the job, so that they cross PCIe at the
       pinned rate (qk_cuda_host_lock: at worst left pageable) */
    int lock[2] = {0, 0};
    const void *lp[2] = {NULL, NULL};
    if (r == QK_OK && !plan && ctx->desc.device == QK_DEVICE_CUDA && !sm.in.on_device && !sm.in.provider) {
        char err[256];
        if (qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err) == QK_OK) {
            /* the rows' span: the last row ends at its elements (an ld may pad the others) */
            const size_t rowb = (size_t)sm.map.n_features * 8;
            const size_t used = qk__state_row_bytes(&sm.op);
            const size_t last = used < rowb ? used : rowb;
            lp[0] = g.x;
            lp[1] = g.y;
            qk_cuda_host_lock(lp[0], (size_t)(g.n_x - 1) * rowb + last, &lock[0]);
            if (lp[1]) qk_cuda_host_lock(lp[1], (size_t)(g.n_y - 1) * rowb + last, &lock[1]);
        }
    }
#endif
    if (r == QK_OK) r = qk__gram_or_plan(ctx, &sm.map, &g, plan);
#if defined(QK_CUDA) && QK_CUDA
    if (lock[0]) qk_cuda_host_unlock(lp[0]);
    if (lock[1]) qk_cuda_host_unlock(lp[1]);
#endif
    qk__smap_free(&sm);
    return r;
}

QKDEF qk_result qk_gram_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc)
{
    return qk__states_run(ctx, states, desc, NULL);
}

QKDEF qk_result qk_plan_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__states_run(ctx, states, desc, out);
}

/* ---- qk_gram_mps_states: K from given matrix product states ---- */
/* Entry (l, a, r) of a site tensor of bonds dl x dr in the layout (docs/states.md, "MPS input"). */
static int64_t qk__mps_in_index(int layout, int dr, int l, int a, int r)
{
    return layout == QK_MPS_LRP ? ((int64_t)l * dr + r) * 2 + a : ((int64_t)l * 2 + a) * dr + r;
}

/* The squared norm of given MPS, per sample, on the context's threads: <psi|psi> by transfer
   matrices, E' = sum_a A_a^H E A_a (O(q chi^3) per sample), as nrm[i] 2^expo[i]: E is scaled by a
   power of two at every site (exact), so that a norm far from 1 at hundreds of sites neither
   overflows nor underflows. nrm[i] NaN where an entry is not finite, 0 for a zero state. */
typedef struct qk__mps_norm_job {
    const qk_mps_states_desc *in;
    int side;
    int64_t n, next;
    double *nrm;
    int64_t *expo;
    int oom;
} qk__mps_norm_job;

static void qk__mps_norm_work(void *arg, int thread)
{
    qk__mps_norm_job *j = (qk__mps_norm_job *)arg;
    const qk_mps_states_desc *in = j->in;
    const int q = in->n_sites, type = (int)in->type, B = QK_MPS_MAX_BOND;
    double *E = (double *)qk__malloc(sizeof(double) * (size_t)(2 * B * B * 2 + 2 * B * 2 * B)), *En, *T;
    int64_t i;
    QK__UNUSED(thread);
    if (!E) { QK__STORE(&j->oom, 1); return; }
    En = E + 2 * B * B;
    T = En + 2 * B * B;
    while ((i = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const void *const *sites = (j->side ? in->b : in->a) + (size_t)i * (size_t)q;
        const int *bond = (j->side ? in->b_bonds : in->a_bonds) + (size_t)i * (size_t)(q + 1);
        int s, l, lp, a, r, rp, bad = 0;
        int64_t ex = 0;
        E[0] = 1; E[1] = 0;
        for (s = 0; s < q && !bad; s++) {
            const int dl = bond[s], dr = bond[s + 1];
            double *sw;
            /* T[l][a][r'] = sum_l' E[l][l'] A[l'][a][r'] */
            for (l = 0; l < dl; l++)
                for (a = 0; a < 2; a++)
                    for (rp = 0; rp < dr; rp++) {
                        double tr = 0, ti = 0, xr, xi;
                        for (lp = 0; lp < dl; lp++) {
                            const double er = E[2 * (l * dl + lp)], ei = E[2 * (l * dl + lp) + 1];
                            qk__state_amp(sites[s], type, qk__mps_in_index(in->layout, dr, lp, a, rp), &xr, &xi);
                            tr += er * xr - ei * xi;
                            ti += er * xi + ei * xr;
                        }
                        T[2 * ((l * 2 + a) * dr + rp)] = tr;
                        T[2 * ((l * 2 + a) * dr + rp) + 1] = ti;
                    }
            /* E'[r][r'] = sum_{l,a} conj(A[l][a][r]) T[l][a][r'], then scaled by a power of two */
            for (r = 0; r < dr; r++)
                for (rp = 0; rp < dr; rp++) {
                    double er = 0, ei = 0, xr, xi;
                    for (l = 0; l < dl; l++)
                        for (a = 0; a < 2; a++) {
                            const double tr = T[2 * ((l * 2 + a) * dr + rp)], ti = T[2 * ((l * 2 + a) * dr + rp) + 1];
                            qk__state_amp(sites[s], type, qk__mps_in_index(in->layout, dr, l, a, r), &xr, &xi);
                            if (!isfinite(xr) || !isfinite(xi)) bad = 1;
                            er += xr * tr + xi * ti;
                            ei += xr * ti - xi * tr;
                        }
                    En[2 * (r * dr + rp)] = er;
                    En[2 * (r * dr + rp) + 1] = ei;
                }
            {
                double c = 0.0;
                for (r = 0; r < 2 * dr * dr; r++) if (fabs(En[r]) > c) c = fabs(En[r]);
                if (c > 0.0 && isfinite(c)) {
                    int e;
                    (void)frexp(c, &e);
                    for (r = 0; r < 2 * dr * dr; r++) En[r] = ldexp(En[r], -e);
                    ex += e;
                }
            }
            sw = E; E = En; En = sw;
        }
        j->nrm[i] = bad || !isfinite(E[0]) ? NAN : E[0] > 0.0 ? E[0] : 0.0;
        j->expo[i] = ex;
    }
    /* E and En may have swapped: free the block's start */
    QK_FREE(E < En ? E : En);
}

/* One side's MPS checked (shapes, finite entries, norms) into mm->D (the largest bonds) and
   mm->scale[off..]; errors name the side, the sample and the site. */
static qk_result qk__mps_in_check(qk__mpsmap *mm, int side, int nt)
{
    const qk_mps_states_desc *in = &mm->in;
    const int q = in->n_sites, type = (int)in->type;
    const char *nm = side ? "B" : "A";
    const void *const *ptr = side ? in->b : in->a;
    const int *bonds = side ? in->b_bonds : in->a_bonds;
    const int64_t n = side ? in->n_b : in->n_a, off = side ? in->n_a : 0;
    qk__mps_norm_job j;
    int64_t i;
    int s;
    if (!bonds) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_mps_states: %s_bonds is NULL", side ? "b" : "a");
    for (i = 0; i < n; i++) {
        const int *bond = bonds + (size_t)i * (size_t)(q + 1);
        for (s = 0; s <= q; s++) {
            if (bond[s] < 1 || bond[s] > QK_MPS_MAX_BOND)
                return qk__fail(bond[s] < 1 ? QK_ERROR_INVALID_ARGUMENT : QK_ERROR_UNSUPPORTED,
                                "%s[%lld]: bond %d (left of site %d) is %d: bonds are 1 .. QK_MPS_MAX_BOND = %d", nm, (long long)i, s, s,
                                bond[s], QK_MPS_MAX_BOND);
            if ((s == 0 || s == q) && bond[s] != 1)
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s[%lld]: the %s bond is %d: an open-boundary MPS has 1 there", nm, (long long)i,
                                s == 0 ? "first (left of site 0)" : "last (right of the last site)", bond[s]);
            if (bond[s] > mm->D[s]) mm->D[s] = bond[s];
        }
        for (s = 0; s < q; s++)
            if (!ptr[(size_t)i * (size_t)q + (size_t)s]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s[%lld] site %d: the tensor is NULL", nm, (long long)i, s);
    }
    memset(&j, 0, sizeof j);
    j.in = in; j.side = side; j.n = n;
    j.nrm = mm->scale + off;
    j.expo = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)n);
    if (j.expo) qk__parallel(nt < n ? nt : (int)n, qk__mps_norm_work, &j);
    if (!j.expo || j.oom) {
        QK_FREE(j.expo);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mps_states: cannot allocate the norm's work space");
    }
    for (i = 0; i < n; i++) {
        const double m0 = j.nrm[i], ss = j.expo[i] > 4096 ? INFINITY : j.expo[i] < -4096 ? 0.0 : ldexp(m0, (int)j.expo[i]);
        char v0[40], v1[40];
        qk_result r = QK_OK;
        if (isnan(m0)) {   /* the first entry that is not finite, for the message */
            const int *bond = bonds + (size_t)i * (size_t)(q + 1);
            int l, a, c;
            for (s = 0; s < q && r == QK_OK; s++)
                for (l = 0; l < bond[s] && r == QK_OK; l++)
                    for (a = 0; a < 2 && r == QK_OK; a++)
                        for (c = 0; c < bond[s + 1] && r == QK_OK; c++) {
                            double re, im;
                            qk__state_amp(ptr[(size_t)i * (size_t)q + (size_t)s], type, qk__mps_in_index(in->layout, bond[s + 1], l, a, c), &re, &im);
                            if (!isfinite(re) || !isfinite(im))
                                r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld] site %d: entry (%d, %d, %d) (left, physical, right) is %s", nm,
                                             (long long)i, s, l, a, c, isnan(re) || isnan(im) ? "NaN" : "Inf");
                        }
            if (r == QK_OK) r = qk__fail(QK_ERROR_NON_FINITE, "%s[%lld]: the squared norm is not finite", nm, (long long)i);
        } else if (m0 == 0.0) r = qk__fail(QK_ERROR_ZERO_NORM, "%s[%lld]: the MPS's squared norm is 0 (a zero state)", nm, (long long)i);
        else if (!in->normalize && !(fabs(ss - 1.0) <= in->norm_tol))
            r = qk__fail(QK_ERROR_BAD_DATA, "%s[%lld]: the MPS's squared norm is %s, off 1 by more than norm_tol %s "
                         "(normalize = 1 scales each state to norm 1)", nm, (long long)i,
                         isfinite(ss) ? qk__fmt_g(v0, sizeof v0, ss, 17) : "beyond 1e308", qk__fmt_g(v1, sizeof v1, in->norm_tol, 3));
        if (r != QK_OK) {
            QK_FREE(j.expo);
            return r;
        }
        /* normalize: every site scaled by ss^(-1/2q) = 2^(-expo/2q) m0^(-1/2q) (one factor on one
           site would leave the float tensors of the GPU engine out of range at hundreds of sites;
           the power of two's exponent is exact) */
        j.nrm[i] = in->normalize ? exp2(-0.5 * (double)j.expo[i] / (double)q) * pow(m0, -0.5 / (double)q) : 1.0;
    }
    QK_FREE(j.expo);
    return QK_OK;
}

static void qk__mpsmap_free(qk__mpsmap *mm)
{
    QK_FREE(mm->D);
    QK_FREE(mm->scale);
}

/* qk_gram_mps_states' map (mm) and Gram desc (*g) from the caller's, every tensor checked. */
static qk_result qk__mpsmap_make(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk__mpsmap *mm, qk_gram_desc *g)
{
    const char *fn = "qk_gram_mps_states";
    qk_mps_states_desc *in = &mm->in;
    qk_result r;
    int nt;
    memset(mm, 0, sizeof *mm);
    memset(g, 0, sizeof *g);
    if (!ctx || !mps || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: NULL %s", fn, !ctx ? "ctx" : !mps ? "mps" : "desc");
    *in = *mps;
    if (in->type == QK_STATE_DEFAULT) in->type = QK_STATE_C128;
    if ((int)in->type < (int)QK_STATE_C128 || (int)in->type > (int)QK_STATE_F32)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown state type %d", fn, (int)mps->type);
    if ((int)in->layout != QK_MPS_LPR && (int)in->layout != QK_MPS_LRP)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: unknown layout %d (QK_MPS_LPR or QK_MPS_LRP)", fn, (int)mps->layout);
    if (in->n_sites < 1 || in->n_sites > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_sites must be 1 .. %d (got %d)", fn, QK_MAX_PRODUCT_QUBITS, in->n_sites);
    if (!in->a) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: a is NULL", fn);
    if (in->n_a <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_a must be > 0 (got %lld)", fn, (long long)in->n_a);
    if (in->b && in->n_b <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: n_b must be > 0 with b (got %lld)", fn, (long long)in->n_b);
    if (!in->b) in->n_b = 0;
    if (in->normalize != 0 && in->normalize != 1) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: normalize must be 0 or 1 (got %d)", fn, in->normalize);
    if (in->norm_tol == 0.0) in->norm_tol = in->type == QK_STATE_C128 || in->type == QK_STATE_F64 ? 1e-9 : 1e-5;
    if (!(in->norm_tol > 0.0 && in->norm_tol < 1.0)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: norm_tol must be in (0, 1) (got %g)", fn, mps->norm_tol);
    if (desc->x || desc->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: desc->x and desc->y must be NULL (the states are mps->a and mps->b)", fn);
    if (desc->path != QK_PATH_DEFAULT && desc->path != QK_PATH_MPS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given MPS take the MPS path (path %d)", fn, (int)desc->path);
    if (desc->mps_max_bond != 0 || desc->mps_cutoff != 0.0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "%s: given MPS are contracted as they are (mps_max_bond and mps_cutoff must be 0)", fn);
    if ((double)(in->n_a + in->n_b) * (double)in->n_sites > 9.0e18) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: too many tensors", fn);
    mm->D = (int *)qk__calloc((size_t)in->n_sites + 1, sizeof(int));
    mm->scale = (double *)qk__malloc(sizeof(double) * (size_t)(in->n_a + in->n_b));
    if (!mm->D || !mm->scale) {
        qk__mpsmap_free(mm);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate the bonds and scales of %lld samples", fn, (long long)(in->n_a + in->n_b));
    }
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    r = qk__mps_in_check(mm, 0, nt);
    if (r == QK_OK && in->b) r = qk__mps_in_check(mm, 1, nt);
    if (r != QK_OK) { qk__mpsmap_free(mm); return r; }
    mm->op.kind = QK__OP_MPS;
    mm->op.angle.kind = QK_ARG_CONST;
    mm->op.angle.scale = 1.0;
    mm->map.type = QK_MAP_CUSTOM;
    mm->map.cls = QK_CLASS_COMPLEX;
    mm->map.n_qubits = in->n_sites;
    mm->map.n_features = 0;
    mm->map.n_ops = 1;
    mm->map.ops = &mm->op;
    mm->map.desc.type = QK_MAP_CUSTOM;
    mm->map.desc.n_qubits = in->n_sites;
    *g = *desc;
    g->path = QK_PATH_MPS;
    g->x = (const double *)(const void *)&mm->side[0];
    g->n_x = in->n_a;
    g->y = in->b ? (const double *)(const void *)&mm->side[1] : NULL;
    g->n_y = in->n_b;
    return QK_OK;
}

static qk_result qk__mps_states_run(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk_plan *plan)
{
    qk__mpsmap mm;
    qk_gram_desc g;
    qk_result r = qk__mpsmap_make(ctx, mps, desc, &mm, &g);
    if (r != QK_OK) return r;
    r = qk__gram_or_plan(ctx, &mm.map, &g, plan);
    qk__mpsmap_free(&mm);
    return r;
}

QKDEF qk_result qk_gram_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc)
{
    return qk__mps_states_run(ctx, mps, desc, NULL);
}

QKDEF qk_result qk_plan_mps_states(qk_ctx *ctx, const qk_mps_states_desc *mps, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__mps_states_run(ctx, mps, desc, out);
}
/* >>vjp ---- qk_gram_vjp: the gradient of a loss of K for every weight (adjoint sweeps); qk_gram_projected ---- */
/* For L(K) with G = dL/dK, S = <psi_i|phi_j> and K = |S|^2:
     dL = sum_ij G_ij 2 Re(conj(S_ij) dS_ij),  dS_ij = <d psi_i|phi_j> + <psi_i|d phi_j>
   so dL = sum_i 2 Re <d psi_i|lam_i> + sum_j 2 Re <d phi_j|mu_j> with
     lam_i = sum_j G_ij conj(S_ij) phi_j,   mu_j = sum_i G_ij S_ij psi_i
   (K(X,X): one set of states, lam_i = sum_j (G_ij + G_ji) conj(S_ij) psi_j). Each sample's
   2 Re <d psi|lam> for every weight at once comes from one adjoint sweep through its circuit:
   s = psi, l = lam; for ops k from last to first, the op's angle derivative is read from s (the
   state after op k) and l, then both go back through op k (U_k^dagger). An op
   exp(-i t Gen / 2) (RX, RY, RZ: Gen the Pauli; RZZ: Z x Z) gives dL/dt = -Im <Gen s|l>; P(t)
   (i Pi_1) gives 2 Im <Pi_1 s|l>; t = scale * w + offset (QK_ARG_W) or scale * w * x (WX) gives
   dt/dw; and (desc.grad_x, grad_y) dt/dx the sample's dL/dx: the same sweep, the angle's
   derivative taken at every op whose angle reads x (x, x x', (pi - x)(pi - x'), w x), each
   sample's row written by the one thread that sweeps it. Cost: the states, S (half of it for K(X,X)), lam (and mu), and a sweep of two vectors
   back through the circuit per sample, whatever the number of weights. CPU engine, fp64, all
   states resident; real maps (qk__vjp_is_real) on one plane throughout. */

/* ---- the products of the VJP (S and the adjoint vectors) as real GEMMs on packed operands ----
   C (m x n) = or += Ap Bp, each operand packed once (in parallel) before the product: A in
   panels of QK__VMR rows ([p][r], the whole k), B in panels of QK__VNR columns ([p][c]); a
   micro-kernel holds a QK__VMR x QK__VNR block of C in registers over QK__VKC values of p
   (12 accumulators of 4 doubles: AVX2's 16 registers), its B panel in L1 and the item's A panels
   in L2. Work items are blocks of QK__VMC x QK__VNC entries of C taken by whichever thread is
   free; each entry is summed by one thread in a fixed order (p chunks in order, p in order in a
   chunk), so C does not depend on the thread count. upper: only the micro-blocks that hold an
   entry with column >= row (the upper triangle of a symmetric product; the rest is not written).
   Runtime dispatch as in cpu_gram.c: a portable x86-64 build also compiles the micro-kernel for
   AVX2 + FMA and uses it where qk__cpu_isa chose AVX2 or AVX-512 (cpu_pool.c). */
#define QK__VMR 6
#define QK__VNR 8
#define QK__VKC 256
#define QK__VMC 48
#define QK__VNC 128

/* m rows of X packed into panels of w rows (zero past m): element (i, p) is X[i ld + p] (trans 0)
   or X[p ld + i] (trans 1) */
typedef struct qk__vpack_job {
    const double *X;
    int64_t ld, m, k, next;
    int trans, w;
    double *P;
} qk__vpack_job;

static void qk__vpack_work(void *p, int thread)
{
    qk__vpack_job *j = (qk__vpack_job *)p;
    const int64_t panels = (j->m + j->w - 1) / j->w;
    int64_t b;
    QK__UNUSED(thread);
    while ((b = QK__FETCH_ADD(&j->next, 1)) * 4 < panels) {
        int64_t ip, q, r;
        for (ip = 4 * b; ip < panels && ip < 4 * b + 4; ip++) {
            double *P = j->P + ip * j->k * j->w;
            const int64_t i0 = ip * j->w, w = j->m - i0 < j->w ? j->m - i0 : j->w;
            if (j->trans)   /* row q of X: w contiguous values */
                for (q = 0; q < j->k; q++) {
                    const double *x = j->X + q * j->ld + i0;
                    for (r = 0; r < j->w; r++) P[q * j->w + r] = r < w ? x[r] : 0.0;
                }
            else
                for (r = 0; r < j->w; r++) {
                    const double *x = j->X + (i0 + r) * j->ld;
                    if (r >= w) for (q = 0; q < j->k; q++) P[q * j->w + r] = 0.0;
                    else for (q = 0; q < j->k; q++) P[q * j->w + r] = x[q];
                }
        }
    }
}

static void qk__vpack(int nt, const double *X, int64_t ld, int trans, int64_t m, int64_t k, int w, double *P)
{
    qk__vpack_job j;
    const int64_t items = ((m + w - 1) / w + 3) / 4;
    j.X = X; j.ld = ld; j.m = m; j.k = k; j.trans = trans; j.w = w; j.P = P; j.next = 0;
    qk__parallel(nt < items ? nt : (int)items, qk__vpack_work, &j);
}

#if defined(QK__VEC)
typedef double qk__gv4 __attribute__((vector_size(4 * sizeof(double))));
/* C[0..mr) x [0..nr) (entry (r, e) at c[r rs + e cs]) = (acc 0) or += (acc 1) the kc-long
   product of an A panel (a) and a B panel (b) */
#define QK__VMK_DEFINE(NAME, ATTR)                                                                  \
    QK__CONTRACT ATTR static void NAME(int64_t kc, const double *a, const double *b, double *c, int64_t rs, \
                                       int64_t cs, int mr, int nr, int acc)                                     \
    {                                                                                               \
        qk__gv4 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, b0, b1;                 \
        double t[QK__VMR][QK__VNR];                                                                 \
        int64_t p;                                                                                  \
        int r, e;                                                                                   \
        memset(&c00, 0, sizeof c00);                                                                \
        c01 = c00; c10 = c00; c11 = c00; c20 = c00; c21 = c00;                                      \
        c30 = c00; c31 = c00; c40 = c00; c41 = c00; c50 = c00; c51 = c00;                           \
        for (p = 0; p < kc; p++, a += QK__VMR, b += QK__VNR) {                                      \
            memcpy(&b0, b, sizeof b0);                                                              \
            memcpy(&b1, b + 4, sizeof b1);                                                          \
            c00 += a[0] * b0; c01 += a[0] * b1;                                                     \
            c10 += a[1] * b0; c11 += a[1] * b1;                                                     \
            c20 += a[2] * b0; c21 += a[2] * b1;                                                     \
            c30 += a[3] * b0; c31 += a[3] * b1;                                                     \
            c40 += a[4] * b0; c41 += a[4] * b1;                                                     \
            c50 += a[5] * b0; c51 += a[5] * b1;                                                     \
        }                                                                                           \
        memcpy(t[0], &c00, sizeof c00); memcpy(t[0] + 4, &c01, sizeof c01);                        \
        memcpy(t[1], &c10, sizeof c10); memcpy(t[1] + 4, &c11, sizeof c11);                        \
        memcpy(t[2], &c20, sizeof c20); memcpy(t[2] + 4, &c21, sizeof c21);                        \
        memcpy(t[3], &c30, sizeof c30); memcpy(t[3] + 4, &c31, sizeof c31);                        \
        memcpy(t[4], &c40, sizeof c40); memcpy(t[4] + 4, &c41, sizeof c41);                        \
        memcpy(t[5], &c50, sizeof c50); memcpy(t[5] + 4, &c51, sizeof c51);                        \
        for (r = 0; r < mr; r++, c += rs)                                                           \
            for (e = 0; e < nr; e++) c[e * cs] = acc ? c[e * cs] + t[r][e] : t[r][e];               \
    }
QK__VMK_DEFINE(qk__vmk, )
#if defined(QK__DISPATCH)
#define QK__VMK_DISPATCH 1
QK__VMK_DEFINE(qk__vmk_avx2, __attribute__((target("avx2,fma"))))
#endif
#undef QK__VMK_DEFINE
#else
static void qk__vmk(int64_t kc, const double *a, const double *b, double *c, int64_t rs, int64_t cs, int mr, int nr, int acc)
{
    double t[QK__VMR][QK__VNR];
    int64_t p;
    int r, e;
    memset(t, 0, sizeof t);
    for (p = 0; p < kc; p++, a += QK__VMR, b += QK__VNR)
        for (r = 0; r < QK__VMR; r++)
            for (e = 0; e < QK__VNR; e++) t[r][e] += a[r] * b[e];
    for (r = 0; r < mr; r++, c += rs)
        for (e = 0; e < nr; e++) c[e * cs] = acc ? c[e * cs] + t[r][e] : t[r][e];
}
#endif

typedef struct qk__vgemm_job {
    int64_t m, n, k, ldc, items_j, n_items, next;
    int upper, acc, isa, packed;
    const double *Ap, *Bp;
    double *C;
} qk__vgemm_job;

static void qk__vgemm_work(void *p, int thread)
{
    qk__vgemm_job *g = (qk__vgemm_job *)p;
    int64_t t;
    QK__UNUSED(thread);
    while ((t = QK__FETCH_ADD(&g->next, 1)) < g->n_items) {
        const int64_t i0 = t / g->items_j * QK__VMC, j0 = t % g->items_j * QK__VNC;
        const int64_t i1 = i0 + QK__VMC < g->m ? i0 + QK__VMC : g->m, j1 = j0 + QK__VNC < g->n ? j0 + QK__VNC : g->n;
        int64_t pc, i, j;
        if (g->upper && j1 <= i0) continue;   /* all below the diagonal */
        for (pc = 0; pc < g->k; pc += QK__VKC) {
            const int64_t kc = g->k - pc < QK__VKC ? g->k - pc : QK__VKC;
            for (j = j0; j < j1; j += QK__VNR)
                for (i = i0; i < i1; i += QK__VMR) {
                    const double *a = g->Ap + i * g->k + pc * QK__VMR, *b = g->Bp + j * g->k + pc * QK__VNR;
                    const int mr = (int)(i1 - i < QK__VMR ? i1 - i : QK__VMR), nr = (int)(j1 - j < QK__VNR ? j1 - j : QK__VNR);
                    const int acc = g->acc || pc > 0;
                    /* row-major, or packed: C in qk__vpack's panels of QK__VMR rows (i is a multiple) */
                    double *c = g->C + i * g->ldc + (g->packed ? j * QK__VMR : j);
                    const int64_t rs = g->packed ? 1 : g->ldc, cs = g->packed ? QK__VMR : 1;
                    if (g->upper && j + QK__VNR <= i) continue;
#if defined(QK__VMK_DISPATCH)
                    if (g->isa) { qk__vmk_avx2(kc, a, b, c, rs, cs, mr, nr, acc); continue; }
#endif
                    qk__vmk(kc, a, b, c, rs, cs, mr, nr, acc);
                }
        }
    }
}

/* C (m x n) = Ap Bp (acc 0) or C + Ap Bp (acc 1); Ap, Bp: qk__vpack's panels of k. C row-major
   (leading dimension ldc), or packed (1) as qk__vpack packs m rows of n values (ldc = n): the
   next product's A operand. */
static void qk__vgemm(int nt, int upper, int acc, int64_t m, int64_t n, int64_t k, const double *Ap, const double *Bp, double *C, int64_t ldc,
                      int packed)
{
    qk__vgemm_job g;
    g.m = m; g.n = n; g.k = k; g.ldc = ldc; g.upper = upper; g.acc = acc; g.Ap = Ap; g.Bp = Bp; g.C = C; g.next = 0; g.packed = packed;
    g.items_j = (n + QK__VNC - 1) / QK__VNC;
    g.n_items = (m + QK__VMC - 1) / QK__VMC * g.items_j;
#if defined(QK__VMK_DISPATCH)
    g.isa = qk__cpu_isa() >= QK__ISA_AVX2;   /* an AVX-512 CPU takes the AVX2 kernel */
#else
    g.isa = 0;
#endif
    qk__parallel(nt < g.n_items ? nt : (int)g.n_items, qk__vgemm_work, &g);
}

typedef struct qk__vjp_job {
    const qk_map *map;
    const double *x, *y;        /* data of the samples (X, then Y) */
    int64_t nx, ny, D, R;       /* R: doubles a state row (D real, 2D complex: re | im) */
    int sym, real;
    const double *A, *B;        /* states; B == A for K(X,X) */
    const double *g;            /* G, ld_g */
    int64_t ld_g;
    double *Wp[4];              /* S = conj(A) B^T (Sr, Si: nx x ny packed as lam's A operand), then
                                   W = G' o conj(S) in place, and W^T (K(X,Y)) (qk__vjp_w_work) */
    double *L, *M;              /* lam (nx rows of R), mu (ny rows; K(X,Y)) */
    double *K;                  /* NULL, or K = |S|^2 (nx x ny) from the W pass */
    int weights;                /* form W, lam (and mu) and sweep: the map has weights or grad_x / grad_y is asked */
    int sweep_x, sweep_y;       /* sweep X's samples (lam), Y's (mu; K(X,Y)) */
    int dx;                     /* dL/dx asked: the sweeps also write gx */
    double *gx;                 /* dL/dx of the swept samples: (nx + ny) rows of n_features */
    double *grad;               /* QK__VJP_CHUNKS x n_weights partial sums */
    double *signs;              /* the sweeps' runs of Z / CZ ops (qk__vjp_diag_runs) */
    int *run, *run_start;
    int oom, cancel;
    int64_t next, swept;
    qk_progress_fn progress;
    void *progress_user;
} qk__vjp_job;

/* the caller's progress (thread 0 is the calling thread): non-zero cancels */
static void qk__vjp_poll(qk__vjp_job *j, int thread)
{
    const int64_t total = j->nx + (j->sym ? 0 : j->ny);
    if (thread != 0 || !j->progress || QK__LOAD(&j->cancel)) return;
    if (j->progress(QK__LOAD(&j->swept), total, j->progress_user)) QK__STORE(&j->cancel, 1);
}

/* W from S and G in blocks of QK__VWB rows, in place of S (both in qk__vpack's layout, panels of
   QK__VMR rows: lam's A operand), and K = |S|^2 (j->K, row-major) on the way:
     K(X,X): W = (G + G^T) o conj(S), Hermitian, from the upper triangle of S (the only part the
       product computed; the lower one is written over): Wp[0] = Wr, Wp[1] = -Wi (lam = Wr B -
       Wi B~, B~ = [Bi | -Br])
     K(X,Y): W = G o conj(S): Wp[0] = Wr, Wp[1] = -Wi (lam), Wp[2] = Wr^T, Wp[3] = Wi^T packed
       as mu's A operand (mu = V^T A with V = G o S = conj(W): mu = Wr^T A + Wi^T A~)
   Each entry (each unordered pair for K(X,X)) is read and written by one thread. */
#define QK__VWB 24
#define QK__VPK(P, i, c, k) ((P)[((i) / QK__VMR) * (k) * QK__VMR + (c) * QK__VMR + (i) % QK__VMR])
static void qk__vjp_w_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const int64_t nx = j->nx, ny = j->ny, ld = j->ld_g;
    double *Wr = j->Wp[0], *Wi = j->Wp[1];
    int64_t b;
    QK__UNUSED(thread);
    while ((b = QK__FETCH_ADD(&j->next, 1)) * QK__VWB < nx) {
        const int64_t i0 = b * QK__VWB, i1 = i0 + QK__VWB < nx ? i0 + QK__VWB : nx;
        int64_t i, c, c0;
        if (j->sym) {
            for (c0 = i0; c0 < ny; c0 += QK__VWB)   /* blocks right of the diagonal: the pairs c >= i */
                for (i = i0; i < i1; i++)
                    for (c = c0 > i ? c0 : i; c < c0 + QK__VWB && c < ny; c++) {
                        const double gv = j->g[i * ld + c] + j->g[c * ld + i], sr = QK__VPK(Wr, i, c, ny);
                        const double si = j->real || c == i ? 0.0 : QK__VPK(Wi, i, c, ny);   /* S_ii is real */
                        if (j->K) j->K[i * ny + c] = j->K[c * ny + i] = sr * sr + si * si;
                        if (!j->weights) continue;
                        QK__VPK(Wr, i, c, ny) = gv * sr;
                        QK__VPK(Wr, c, i, ny) = gv * sr;
                        if (!j->real) {
                            QK__VPK(Wi, i, c, ny) = gv * si;                /* -Wi_ic */
                            if (c != i) QK__VPK(Wi, c, i, ny) = -gv * si;   /* -Wi_ci = Wi_ic */
                        }
                    }
        } else
            for (i = i0; i < i1; i++)
                for (c = 0; c < ny; c++) {
                    const double gv = j->g[i * ld + c], sr = QK__VPK(Wr, i, c, ny), si = j->real ? 0.0 : QK__VPK(Wi, i, c, ny);
                    if (j->K) j->K[i * ny + c] = sr * sr + si * si;
                    if (!j->weights) continue;
                    QK__VPK(Wr, i, c, ny) = gv * sr;
                    if (j->sweep_y) QK__VPK(j->Wp[2], c, i, nx) = gv * sr;
                    if (!j->real) {
                        QK__VPK(Wi, i, c, ny) = gv * si;
                        if (j->sweep_y) QK__VPK(j->Wp[3], c, i, nx) = -gv * si;
                    }
                }
    }
}

/* <Gen s|l> of an angled op (the generator applied to s where it acts), complex states */
static void qk__vjp_gen_dot(const qk_op *o, const double *s, const double *l, int64_t D, double *re, double *im)
{
    const double *si = s + D, *li = l + D;
    const int64_t b0 = (int64_t)1 << o->q0, b1 = qk__op_arity(o->kind) == 2 ? (int64_t)1 << o->q1 : 0;
    double r = 0, m = 0;
    int64_t i;
    for (i = 0; i < D; i++) {
        double gr, gi;   /* (Gen s)[i] */
        switch (o->kind) {
        case QK_OP_RX: gr = s[i ^ b0]; gi = si[i ^ b0]; break;
        case QK_OP_RY:   /* Y: (Ys)[i] = -i s[i^b] where bit clear, +i s[i^b] where set */
            if (i & b0) { gr = -si[i ^ b0]; gi = s[i ^ b0]; } else { gr = si[i ^ b0]; gi = -s[i ^ b0]; }
            break;
        case QK_OP_RZ: gr = (i & b0) ? -s[i] : s[i]; gi = (i & b0) ? -si[i] : si[i]; break;
        case QK_OP_RZZ: {
            const int odd = ((i & b0) != 0) != ((i & b1) != 0);
            gr = odd ? -s[i] : s[i];
            gi = odd ? -si[i] : si[i];
            break;
        }
        default: /* P: the projector on the qubit's |1> */
            gr = (i & b0) ? s[i] : 0.0;
            gi = (i & b0) ? si[i] : 0.0;
            break;
        }
        r += gr * l[i] + gi * li[i];
        m += gr * li[i] - gi * l[i];
    }
    *re = r;
    *im = m;
}

/* An RY at angle t on the bit b in a real sweep, one pass over the pairs (i, i + b) (bit b of i
   clear): dot: returns Im <Y s|l> (its real part is 0); back: then s and l go back through it
   (RY(-t), as qk__apply would). From b = 4 on the sum runs in 4 lanes (i mod 4) added in a fixed
   order at the end: vectors, not one chain of dependent adds. */
QK__CONTRACT static double qk__vjp_ry_real(double *s, double *l, int64_t D, int64_t b, double t, int dot, int back)
{
    double m = 0, u[8];
    int64_t i0, i;
    (void)qk__u1(QK_OP_RY, -t, 0, u);
    if (b >= 4) {
#if defined(QK__VEC)
        qk__gv4 acc, s0, s1, l0, l1, v;
        memset(&acc, 0, sizeof acc);
        for (i0 = 0; i0 < D; i0 += 2 * b)
            for (i = i0; i < i0 + b; i += 4) {
                memcpy(&s0, s + i, sizeof s0); memcpy(&s1, s + i + b, sizeof s1);
                memcpy(&l0, l + i, sizeof l0); memcpy(&l1, l + i + b, sizeof l1);
                if (dot) acc += s1 * l0 - s0 * l1;
                if (back) {
                    v = u[0] * s0 + u[2] * s1; memcpy(s + i, &v, sizeof v);
                    v = u[4] * s0 + u[6] * s1; memcpy(s + i + b, &v, sizeof v);
                    v = u[0] * l0 + u[2] * l1; memcpy(l + i, &v, sizeof v);
                    v = u[4] * l0 + u[6] * l1; memcpy(l + i + b, &v, sizeof v);
                }
            }
        return (acc[0] + acc[1]) + (acc[2] + acc[3]);
#else
        double a4[4] = {0, 0, 0, 0};
        int e;
        for (i0 = 0; i0 < D; i0 += 2 * b)
            for (i = i0; i < i0 + b; i += 4)
                for (e = 0; e < 4; e++) {
                    const double s0 = s[i + e], s1 = s[i + e + b], l0 = l[i + e], l1 = l[i + e + b];
                    if (dot) a4[e] += s1 * l0 - s0 * l1;
                    if (back) {
                        s[i + e] = u[0] * s0 + u[2] * s1; s[i + e + b] = u[4] * s0 + u[6] * s1;
                        l[i + e] = u[0] * l0 + u[2] * l1; l[i + e + b] = u[4] * l0 + u[6] * l1;
                    }
                }
        return (a4[0] + a4[1]) + (a4[2] + a4[3]);
#endif
    }
    for (i0 = 0; i0 < D; i0 += 2 * b)
        for (i = i0; i < i0 + b; i++) {
            const double s0 = s[i], s1 = s[i + b], l0 = l[i], l1 = l[i + b];
            if (dot) m += s1 * l0 - s0 * l1;
            if (back) {
                s[i] = u[0] * s0 + u[2] * s1;
                s[i + b] = u[4] * s0 + u[6] * s1;
                l[i] = u[0] * l0 + u[2] * l1;
                l[i + b] = u[4] * l0 + u[6] * l1;
            }
        }
    return m;
}

/* An RZ at angle t on the bit b in a complex sweep (s, l: [re | im]), one pass: dot: returns
   Im <Z s|l>; back: then s and l go back through it (RZ(-t): e^{+-it/2} by the bit, as qk__apply
   would, without its call per run of indices). The sum in 4 lanes (i mod 4), added in a fixed
   order. */
static double qk__vjp_rz(double *s, double *l, int64_t D, int64_t b, double t, int dot, int back)
{
    double m[4] = {0, 0, 0, 0}, u[8];
    double *si = s + D, *li = l + D;
    int64_t i;
    (void)qk__u1(QK_OP_RZ, -t, 0, u);
    for (i = 0; i < D; i++) {
        const int set = (i & b) != 0;
        const double sr = s[i], sm = si[i], lr = l[i], lm = li[i];
        const double pr = set ? u[6] : u[0], pi = set ? u[7] : u[1];
        if (dot) m[i & 3] += set ? -(sr * lm - sm * lr) : sr * lm - sm * lr;
        if (back) {
            s[i] = pr * sr - pi * sm; si[i] = pr * sm + pi * sr;
            l[i] = pr * lr - pi * lm; li[i] = pr * lm + pi * lr;
        }
    }
    return (m[0] + m[1]) + (m[2] + m[3]);
}

/* Runs of consecutive Z and CZ ops (a CZ ring): diagonal, +-1, the same for every sample, each
   its own inverse. The sweeps take a run in one pass, times its table of signs (j->signs: one
   table of D per run; j->run[k]: the run's table where op k is a run's last op, else -1;
   j->run_start[k]: the run's first op). Returns the number of runs, or -1 (out of memory). */
static int qk__vjp_diag_runs(qk__vjp_job *j)
{
    const qk_map *m = j->map;
    int k, k0, n = 0;
    int64_t i;
    for (k = 0; k < m->n_ops; k++) {
        const int diag = m->ops[k].kind == QK_OP_Z || m->ops[k].kind == QK_OP_CZ;
        const int next = k + 1 < m->n_ops && (m->ops[k + 1].kind == QK_OP_Z || m->ops[k + 1].kind == QK_OP_CZ);
        j->run[k] = diag && !next ? n++ : -1;
    }
    if (n == 0) return 0;
    j->signs = (double *)qk__malloc(sizeof(double) * (size_t)n * (size_t)j->D);
    if (!j->signs) return -1;
    for (k = 0; k < m->n_ops; k++) {
        double *t;
        if (j->run[k] < 0) continue;
        t = j->signs + (size_t)j->run[k] * (size_t)j->D;
        for (i = 0; i < j->D; i++) t[i] = 1.0;
        for (k0 = k; k0 >= 0 && (m->ops[k0].kind == QK_OP_Z || m->ops[k0].kind == QK_OP_CZ); k0--) {
            const qk_op *o = &m->ops[k0];
            const int64_t mask = ((int64_t)1 << o->q0) | (o->kind == QK_OP_CZ ? (int64_t)1 << o->q1 : 0);
            for (i = 0; i < j->D; i++) t[i] = (i & mask) == mask ? -t[i] : t[i];
        }
        j->run_start[k] = k0 + 1;
    }
    return n;
}

/* 1 when the angle reads a feature */
static int qk__vjp_reads_x(const qk_angle *a)
{
    return a->kind == QK_ARG_X || a->kind == QK_ARG_XX || a->kind == QK_ARG_PIXX || a->kind == QK_ARG_WX;
}

/* dL/dt of an angle t(x) into the sample's dL/dx (gx, n_features values): dt/dx by the angle's form */
static void qk__vjp_dx(const qk_angle *a, const double *x, const double *w, double dt, double *gx)
{
    const double pi = 3.14159265358979323846;
    switch (a->kind) {
    case QK_ARG_X: gx[a->x0] += dt * a->scale; break;
    case QK_ARG_XX: gx[a->x0] += dt * a->scale * x[a->x1]; gx[a->x1] += dt * a->scale * x[a->x0]; break;
    case QK_ARG_PIXX: gx[a->x0] -= dt * a->scale * (pi - x[a->x1]); gx[a->x1] -= dt * a->scale * (pi - x[a->x0]); break;
    case QK_ARG_WX: gx[a->x0] += dt * a->scale * w[a->w]; break;
    default: break;
    }
}

/* The adjoint sweeps, in QK__VJP_CHUNKS chunks of samples taken by whichever thread is free,
   each chunk's sums in its own row of grad: the total (summed in chunk order) does not depend
   on the threads. Real maps (j->real): s and l are real (one plane), every weighted op an RY. */
#define QK__VJP_CHUNKS 64
static void qk__vjp_sweep_work(void *p, int thread)
{
    qk__vjp_job *j = (qk__vjp_job *)p;
    const qk_map *m = j->map;
    const int64_t D = j->D, R = j->R, total = j->nx + (j->sym ? 0 : j->ny);
    double *s = (double *)qk__malloc(sizeof(double) * (size_t)(2 * R + m->n_ops + 1));
    double *l = s ? s + R : NULL, *theta = s ? s + 2 * R : NULL;
    int64_t ch;
    if (!s) { QK__STORE(&j->oom, 1); return; }
    /* thread 0 polls before each chunk it takes (the first included: the others may take them all) */
    while ((qk__vjp_poll(j, thread), (ch = QK__FETCH_ADD(&j->next, 1)) < QK__VJP_CHUNKS) && !QK__LOAD(&j->oom) && !QK__LOAD(&j->cancel)) {
        const int64_t r0 = total * ch / QK__VJP_CHUNKS, r1 = total * (ch + 1) / QK__VJP_CHUNKS;
        double *grad = j->grad + (size_t)ch * (size_t)m->n_weights;
        int64_t r;
        for (r = r0; r < r1; r++) {
            const int from_y = r >= j->nx;
            const int64_t i = from_y ? r - j->nx : r;
            const double *x = (from_y ? j->y : j->x) + i * m->n_features;
            double *gx = j->dx ? j->gx + r * m->n_features : NULL;
            int k;
            if (from_y ? !j->sweep_y : !j->sweep_x) continue;
            memcpy(s, (from_y ? j->B : j->A) + i * R, sizeof(double) * (size_t)R);
            memcpy(l, (from_y ? j->M : j->L) + i * R, sizeof(double) * (size_t)R);
            qk_map_angles(m, x, theta);
            for (k = m->n_ops - 1; k >= 0; k--) {
                const qk_op *o = &m->ops[k];
                const int weighted = qk__op_has_angle(o->kind) && (o->angle.kind == QK_ARG_W || o->angle.kind == QK_ARG_WX);
                const double dw = weighted ? o->angle.scale * (o->angle.kind == QK_ARG_WX ? x[o->angle.x0] : 1.0) : 0.0;
                const int xd = gx && qk__op_has_angle(o->kind) && qk__vjp_reads_x(&o->angle);
                if (o->kind == QK_OP_AMPLITUDE) break;   /* the first op; nothing before it has a weight */
                if (o->kind == QK_OP_RY || o->kind == QK_OP_RZ) {   /* the derivative and the step back in one pass */
                    /* RY is real: Im <Y s|l> of complex s, l is the real one of each plane, summed */
                    const int64_t b = (int64_t)1 << o->q0;
                    double im;
                    if (o->kind == QK_OP_RZ) im = qk__vjp_rz(s, l, D, b, theta[k], weighted || xd, k > 0);
                    else {
                        im = qk__vjp_ry_real(s, l, D, b, theta[k], weighted || xd, k > 0);
                        if (!j->real) im += qk__vjp_ry_real(s + D, l + D, D, b, theta[k], weighted || xd, k > 0);
                    }
                    if (weighted) grad[o->angle.w] += -im * dw;
                    if (xd) qk__vjp_dx(&o->angle, x, m->weights, -im, gx);
                    if (k == 0) break;
                    continue;
                }
                if (weighted || xd) {   /* (real maps: only RY has an angle) */
                    double re, im, dt;
                    qk__vjp_gen_dot(o, s, l, D, &re, &im);
                    dt = o->kind == QK_OP_P ? 2.0 * im : -im;
                    if (weighted) grad[o->angle.w] += dt * dw;
                    if (xd) qk__vjp_dx(&o->angle, x, m->weights, dt, gx);
                }
                if (k == 0) break;
                if (j->run[k] >= 0) {   /* a run of Z / CZ ops (ending here): one pass with its signs */
                    const double *sg = j->signs + (size_t)j->run[k] * (size_t)D;
                    int64_t a;
                    for (a = 0; a < D; a++) { s[a] *= sg[a]; l[a] *= sg[a]; }
                    if (!j->real)
                        for (a = 0; a < D; a++) { s[D + a] *= sg[a]; l[D + a] *= sg[a]; }
                    k = j->run_start[k];
                    if (k == 0) break;
                    continue;
                }
                /* back through op k: U^dagger is the op at -t (angled), itself otherwise */
                qk__apply(o, -theta[k], x, s, j->real ? NULL : s + D, m->n_qubits);
                qk__apply(o, -theta[k], x, l, j->real ? NULL : l + D, m->n_qubits);
            }
        }
        (void)QK__FETCH_ADD(&j->swept, r1 - r0);
    }
    QK_FREE(s);
}

/* A map whose states are real and whose weighted ops are all RY: the real path (one plane) */
static int qk__vjp_is_real(const qk_map *m)
{
    int k;
    for (k = 0; k < m->n_ops; k++) {
        const qk_op *o = &m->ops[k];
        switch (o->kind) {
        case QK_OP_H: case QK_OP_X: case QK_OP_Z: case QK_OP_RY: case QK_OP_CNOT: case QK_OP_CZ: case QK_OP_AMPLITUDE: case QK_OP_BASIS: break;
        default: return 0;
        }
        if (qk__op_has_angle(o->kind) && (o->angle.kind == QK_ARG_W || o->angle.kind == QK_ARG_WX) && o->kind != QK_OP_RY) return 0;
    }
    return 1;
}

/* One side's adjoint vectors (lam or mu), rows x R: out = W0 S + W1 S~ (real states: W0 S), with
   S, S~ the other side's states (inner rows of R; S~ as qk__vjp_tilde makes it), packed in Pb. */
static void qk__vjp_adjoint(int nt, int real, int64_t rows, int64_t inner, int64_t R, const double *W0, const double *W1,
                            const double *S, const double *St, double *Pb, double *out)
{
    qk__vpack(nt, S, R, 1, R, inner, QK__VNR, Pb);
    qk__vgemm(nt, 0, 0, rows, R, inner, W0, Pb, out, R, 0);
    if (!real) {
        qk__vpack(nt, St, R, 1, R, inner, QK__VNR, Pb);
        qk__vgemm(nt, 0, 1, rows, R, inner, W1, Pb, out, R, 0);
    }
}

/* rows of [re | im] (D each) into rows of [im | -re] */
static double *qk__vjp_tilde(const double *S, int64_t n, int64_t D)
{
    double *T = (double *)qk__malloc(sizeof(double) * (size_t)(2 * n * D));
    int64_t i, d;
    if (!T) return NULL;
    for (i = 0; i < n; i++)
        for (d = 0; d < D; d++) { T[i * 2 * D + d] = S[i * 2 * D + D + d]; T[i * 2 * D + D + d] = -S[i * 2 * D + d]; }
    return T;
}

QKDEF qk_result qk_gram_vjp(qk_ctx *ctx, const qk_map *map, const qk_vjp_desc *d)
{
    qk__vjp_job j;
    qk_result r;
    qk__tpool *outer = qk__cur_pool;
    int64_t i, c, cols, D, R, nx, npa, npb, nw, nwt;
    int t, nt, k;
    double bytes, *Pa = NULL, *Pb = NULL, *At = NULL, *Bt = NULL;
    if (!ctx || !map || !d) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!d->g) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: g (dL/dK) is NULL");
    if (map->n_weights > 0 && !d->grad_w && !d->grad_x && !d->grad_y)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: grad_w is NULL (the map has %d weights)", map->n_weights);
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: a map of given states has no weights");
    if (d->grad_y && !d->y) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: grad_y is for K(X,Y) (y is NULL; grad_x holds X's both roles)");
    if (d->grad_x || d->grad_y)
        for (k = 0; k < map->n_ops; k++)
            if (map->ops[k].kind == QK_OP_AMPLITUDE || map->ops[k].kind == QK_OP_BASIS)
                return qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram_vjp: grad_x / grad_y: the map's %s encoding does not enter a gate angle "
                                "(dL/dx for angle encodings only)", map->ops[k].kind == QK_OP_AMPLITUDE ? "amplitude" : "basis");
    if (map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "qk_gram_vjp: %d qubits: the gradient runs on statevectors (at most %d qubits)", map->n_qubits,
                        QK_MAX_STATE_QUBITS);
    if (!d->x || d->n_x <= 0 || (d->y && d->n_y <= 0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: %s", !d->x ? "x is NULL" : d->n_x <= 0 ? "n_x must be > 0" : "n_y must be > 0");
    r = qk_map_check_data(map, d->x, d->n_x, "X");
    if (r == QK_OK && d->y) r = qk_map_check_data(map, d->y, d->n_y, "Y");
    if (r != QK_OK) return r;
    cols = d->y ? d->n_y : d->n_x;
    nx = d->n_x;
    if (d->ld_g != 0 && d->ld_g < cols) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_vjp: ld_g %lld < columns %lld", (long long)d->ld_g, (long long)cols);
    memset(&j, 0, sizeof j);
    j.ld_g = d->ld_g ? d->ld_g : cols;
#if defined(QK_CUDA) && QK_CUDA
    /* the GPU engine (src/cuda/vjp.cuh), the context's first GPU: dL/dw and K; dL/dX (grad_x,
       grad_y) runs on the CPU engine below (docs/gradients.md). G is checked there, on the host
       threads that copy it into the context's page-locked staging (grown to 32 MB a buffer). */
    if (ctx->desc.device == QK_DEVICE_CUDA && !d->grad_x && !d->grad_y) {
        char err[512] = "";
        void *none[2] = {NULL, NULL};
        const size_t need = (size_t)cols * 8 > ((size_t)32 << 20) ? (size_t)cols * 8 : ((size_t)32 << 20);
        r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
        if (r == QK_OK)
            r = qk_cuda_gram_vjp(map, d, qk__vjp_is_real(map), qk__cuda_pool(ctx, 0), qk__ctx_stage(ctx, need) ? ctx->stage : none,
                                 ctx->stage_bytes, err, sizeof err);
        return r == QK_OK ? QK_OK : qk__fail(r, "%s", err[0] ? err : "qk_gram_vjp: the GPU engine failed");
    }
#endif
    for (i = 0; i < nx; i++)
        for (c = 0; c < cols; c++)
            if (!isfinite(d->g[i * j.ld_g + c])) return qk__fail(QK_ERROR_NON_FINITE, "qk_gram_vjp: g[%lld][%lld] is not finite", (long long)i, (long long)c);
    D = (int64_t)1 << map->n_qubits;
    j.real = qk__vjp_is_real(map);   /* real states, S, W, lam: one plane, half the products */
    R = j.real ? D : 2 * D;
    j.sym = d->y == NULL;
    j.dx = d->grad_x || d->grad_y;
    j.sweep_x = (map->n_weights > 0 && d->grad_w) || d->grad_x;
    j.sweep_y = !j.sym && ((map->n_weights > 0 && d->grad_w) || d->grad_y);
    /* packed panels: S's operands (A by QK__VMR rows in Pa, B by QK__VNR in Pb), then lam's and
       mu's B operands (the states by QK__VNR columns) in Pb again; lam in Pa (free by then);
       S and W in the same planes (1 real, 2 complex; K(X,Y): W^T too) */
    npa = ((nx + QK__VMR - 1) / QK__VMR * QK__VMR) * R;
    npb = ((cols + QK__VNR - 1) / QK__VNR * QK__VNR) * R;
    c = ((R + QK__VNR - 1) / QK__VNR * QK__VNR) * (nx > cols ? nx : cols);
    if (c > npb) npb = c;
    nw = (nx + QK__VMR - 1) / QK__VMR * QK__VMR * cols;
    nwt = (cols + QK__VMR - 1) / QK__VMR * QK__VMR * nx;
    /* states (and their [im | -re] rows), S / W, the packed operands, mu, K */
    bytes = 8.0 * ((j.real ? 1.0 : 2.0) * (double)R * (double)(nx + (d->y ? cols : 0)) +
                   (j.real ? 1.0 : 2.0) * ((double)nw + (j.sym ? 0.0 : (double)nwt)) + (double)npa + (double)npb +
                   (j.sym ? 0.0 : (double)cols * (double)R) + (d->k_out ? (double)nx * (double)cols : 0.0) +
                   (j.dx ? (double)(nx + (j.sym ? 0 : cols)) * (double)map->n_features : 0.0));
    if (ctx->desc.host_memory && bytes > (double)ctx->desc.host_memory)
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: the states, S and the adjoint vectors need %.3g GB, the host budget is %.3g GB "
                        "(the gradient keeps every state resident)", bytes * 1e-9, (double)ctx->desc.host_memory * 1e-9);
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
    qk__cur_pool = qk__ctx_pool(ctx);   /* as qk_gram: every parallel step below runs on it */
    j.map = map; j.x = d->x; j.y = d->y; j.nx = nx; j.ny = cols; j.D = D; j.R = R; j.g = d->g;
    j.progress = d->progress;
    j.progress_user = d->progress_user;
    QK_PROF_BEGIN("vjp states");
    j.A = qk__cpu_states(map, d->x, 0, nx, j.real ? QK_PATH_REAL : QK_PATH_COMPLEX, nt, NULL);
    if (j.A && d->y) j.B = qk__cpu_states(map, d->y, 0, cols, j.real ? QK_PATH_REAL : QK_PATH_COMPLEX, nt, NULL);
    else j.B = j.A;
    if (!j.real && j.A && j.B) {
        At = qk__vjp_tilde(j.A, nx, D);
        Bt = j.sym ? At : qk__vjp_tilde(j.B, cols, D);
    }
    QK_PROF_END("vjp states");
    Pa = (double *)qk__malloc(sizeof(double) * (size_t)npa);
    Pb = (double *)qk__malloc(sizeof(double) * (size_t)npb);
    j.weights = j.sweep_x || j.sweep_y;
    for (k = 0; k < 4; k++)
        if ((k < 2 || j.sweep_y) && (k % 2 == 0 || !j.real)) {
            j.Wp[k] = (double *)qk__malloc(sizeof(double) * (size_t)(k < 2 ? nw : nwt));
            if (!j.Wp[k]) break;
        }
    j.L = Pa;
    if (j.sweep_y) j.M = (double *)qk__malloc(sizeof(double) * (size_t)(cols * R));
    if (j.dx) j.gx = (double *)qk__calloc((size_t)(nx + (j.sym ? 0 : cols)) * (size_t)map->n_features, sizeof(double));
    if (d->k_out) j.K = (double *)qk__malloc(sizeof(double) * (size_t)(nx * cols));
    j.grad = (double *)qk__calloc((size_t)QK__VJP_CHUNKS * (size_t)(map->n_weights > 0 ? map->n_weights : 1), sizeof(double));
    j.run = (int *)qk__malloc(sizeof(int) * (size_t)(2 * map->n_ops + 2));
    j.run_start = j.run ? j.run + map->n_ops + 1 : NULL;
    if (j.run && qk__vjp_diag_runs(&j) < 0) { QK_FREE(j.run); j.run = NULL; }
    if (!j.A || !j.B || (!j.real && (!At || !Bt)) || !Pa || !Pb || !j.Wp[0] || (!j.real && !j.Wp[1]) ||
        (j.sweep_y && (!j.Wp[2] || (!j.real && !j.Wp[3]) || !j.M)) || (d->k_out && !j.K) || (j.dx && !j.gx) || !j.grad || !j.run) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: cannot allocate %.3g GB of host memory (states, S, adjoint vectors)", bytes * 1e-9);
        goto done;
    }
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    /* S = conj(A) B^T: Sr = A . B (rows of R), Si = A . B~ with B~ = [Bi | -Br]; K(X,X): the
       upper triangle */
    QK_PROF_BEGIN("vjp S");
    qk__vpack(nt, j.A, R, 0, nx, R, QK__VMR, Pa);
    qk__vpack(nt, j.B, R, 0, cols, R, QK__VNR, Pb);
    qk__vgemm(nt, j.sym, 0, nx, cols, R, Pa, Pb, j.Wp[0], cols, 1);
    if (!j.real) {
        qk__vpack(nt, Bt, R, 0, cols, R, QK__VNR, Pb);
        qk__vgemm(nt, j.sym, 0, nx, cols, R, Pa, Pb, j.Wp[1], cols, 1);
    }
    QK_PROF_END("vjp S");
    qk__vjp_poll(&j, 0);
    if (j.cancel) goto cancelled;
    QK_PROF_BEGIN("vjp W");   /* W in place of S, and K */
    j.next = 0;
    qk__parallel(nt, qk__vjp_w_work, &j);
    QK_PROF_END("vjp W");
    if (j.weights) {
        QK_PROF_BEGIN("vjp adjoint vectors");
        /* lam = Wr B - Wi B~ (real: W B); mu = Wr^T A + Wi^T A~ (real: W^T A) */
        if (j.sweep_x) qk__vjp_adjoint(nt, j.real, nx, cols, R, j.Wp[0], j.Wp[1], j.B, Bt, Pb, j.L);
        if (j.sweep_y) qk__vjp_adjoint(nt, j.real, cols, nx, R, j.Wp[2], j.Wp[3], j.A, At, Pb, j.M);
        QK_PROF_END("vjp adjoint vectors");
        qk__vjp_poll(&j, 0);
        if (j.cancel) goto cancelled;
        QK_PROF_BEGIN("vjp sweeps");
        j.next = 0;
        qk__parallel(nt, qk__vjp_sweep_work, &j);
        QK_PROF_END("vjp sweeps");
        if (j.oom) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_vjp: out of host memory for the sweeps' scratch"); goto done; }
        if (j.cancel) goto cancelled;
        for (i = 0; d->grad_w && i < map->n_weights; i++) {
            double sum = 0.0;
            for (t = 0; t < QK__VJP_CHUNKS; t++) sum += j.grad[(size_t)t * (size_t)map->n_weights + (size_t)i];
            d->grad_w[i] = sum;
        }
        if (d->grad_x) memcpy(d->grad_x, j.gx, sizeof(double) * (size_t)(nx * map->n_features));
        if (d->grad_y) memcpy(d->grad_y, j.gx + nx * map->n_features, sizeof(double) * (size_t)(cols * map->n_features));
    }
    if (d->k_out) memcpy(d->k_out, j.K, sizeof(double) * (size_t)(nx * cols));   /* once nothing can fail */
    r = QK_OK;
    goto done;
cancelled:
    r = qk__fail(QK_ERROR_CANCELLED, "qk_gram_vjp: cancelled by the progress callback (nothing was written)");
done:
    qk__cur_pool = outer;
    QK_FREE(j.grad);
    QK_FREE(j.gx);
    QK_FREE(j.run);
    QK_FREE(j.signs);
    QK_FREE(j.M);
    QK_FREE(j.K);
    for (k = 0; k < 4; k++) QK_FREE(j.Wp[k]);
    QK_FREE(Pb);
    QK_FREE(Pa);
    if (Bt != At) QK_FREE(Bt);
    QK_FREE(At);
    if (j.B != j.A) QK_FREE((void *)(uintptr_t)j.B);
    QK_FREE((void *)(uintptr_t)j.A);
    return r;
}

/* ---- the projected quantum kernel (Huang et al., Nat. Commun. 12, 2631 (2021)) ---- */
/* K(x, x') = exp(-gamma sum_k ||rho_k(x) - rho_k(x')||_F^2) over the one-qubit reduced density
   matrices rho_k. A 2x2 density matrix is (rho00, rho01) (rho11 = 1 - rho00, rho10 =
   conj(rho01)), so ||rho - sigma||_F^2 = 2 (d00^2 + |d01|^2): each sample's 3q features f =
   (rho00, Re rho01, Im rho01) per qubit make K = exp(-2 gamma |f - f'|^2). Statevector maps read
   the features off the state (bit k of an amplitude's index is qubit k); product maps off the
   qubits' 2-vectors, at any qubit count. */
typedef struct qk__pq_job {
    const qk_map *map;
    const double *x;
    int64_t n, next;
    int product, oom;
    double *f;                  /* n x 3q */
} qk__pq_job;

static void qk__pq_work(void *p, int thread)
{
    qk__pq_job *j = (qk__pq_job *)p;
    const qk_map *m = j->map;
    const int q = m->n_qubits;
    const int64_t D = j->product ? 0 : (int64_t)1 << q;
    double *buf = (double *)qk__malloc(sizeof(double) * (size_t)((j->product ? 4 * q : 2 * D) + m->n_ops + 1 + qk__diag_scratch(j->product ? 0 : q)));
    double *theta = buf ? buf + (j->product ? 4 * q : 2 * D) : NULL;
    int64_t s;
    QK__UNUSED(thread);
    if (!buf) { QK__STORE(&j->oom, 1); return; }
    while ((s = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *x = j->x + s * m->n_features;
        double *f = j->f + s * 3 * q;
        int k;
        if (j->product) {
            qk__product1(m, x, buf, theta);
            for (k = 0; k < q; k++) {   /* |u><u|: rho00 = |u0|^2, rho01 = u0 conj(u1) */
                const double *u = buf + 4 * k;
                f[3 * k] = u[QK__QV_RE0] * u[QK__QV_RE0] + u[QK__QV_IM0] * u[QK__QV_IM0];
                f[3 * k + 1] = u[QK__QV_RE0] * u[QK__QV_RE1] + u[QK__QV_IM0] * u[QK__QV_IM1];
                f[3 * k + 2] = u[QK__QV_IM0] * u[QK__QV_RE1] - u[QK__QV_RE0] * u[QK__QV_IM1];
            }
        } else {
            const double *re = buf, *im = buf + D;
            qk__state1(m, x, buf, buf + D, theta, NULL);
            for (k = 0; k < q; k++) {
                const int64_t b = (int64_t)1 << k;
                double r00 = 0, r01r = 0, r01i = 0;
                int64_t i;
                for (i = 0; i < D; i++) {
                    if (i & b) continue;
                    r00 += re[i] * re[i] + im[i] * im[i];
                    /* psi_i conj(psi_{i|b}) */
                    r01r += re[i] * re[i | b] + im[i] * im[i | b];
                    r01i += im[i] * re[i | b] - re[i] * im[i | b];
                }
                f[3 * k] = r00; f[3 * k + 1] = r01r; f[3 * k + 2] = r01i;
            }
        }
    }
    QK_FREE(buf);
}

/* The features of an MPS (the MPS path: entangling maps beyond the statevector, 100-784 qubits):
   each sample's MPS (the exact builder, or truncated as qk_gram_desc asks) in the engine's lane
   layout, then per sample two sweeps of environments: left, L_{s+1} = sum_a A_a^H L_s A_a stored
   for every site (with A_a the site's matrix at physical value a: L_s[l][l'] is the left part's
   <l'|l>), and right, R_s from R_{s+1} likewise, with at each site
     rho_s[a][a'] = sum L_s[l][l'] A[l][a][r] conj(A[l'][a'][r']) R_{s+1}[r][r'],
   divided by its trace (the norm, 1 but for rounding). O(q chi^3) per sample; site s is qubit
   order[s]. Samples in chunks of at most 512, so memory stays O(chunk) in the MPS. */
typedef struct qk__pq_mps_job {
    const qk__mps_prog *p;
    const double *lanes;        /* the chunk's MPS (lane layout) */
    int64_t n, next;
    double *f;                  /* the chunk's rows: n x 3q */
    int oom;
} qk__pq_mps_job;

/* Complex sums over arrays of interleaved (re, im) values, element k at p[2k], p[2k + 1], the terms
   added in the order given, into out[0], out[1]. qk__cdot: sum_{k<n} p[k sp] q[k sq], strides in
   elements. qk__cdot_conj: sum_{u<nu, v<nv} p[e] conj(q[e]), e = u su + v (u outer). */
static void qk__cdot(const double *p, int64_t sp, const double *q, int64_t sq, int n, double *out)
{
    double re = 0, im = 0;
    int k;
    for (k = 0; k < n; k++) {
        const double pr = p[2 * k * sp], pi = p[2 * k * sp + 1], qr = q[2 * k * sq], qi = q[2 * k * sq + 1];
        re += pr * qr - pi * qi;
        im += pr * qi + pi * qr;
    }
    out[0] = re;
    out[1] = im;
}

static void qk__cdot_conj(const double *p, const double *q, int nu, int64_t su, int nv, double *out)
{
    double re = 0, im = 0;
    int u, v;
    for (u = 0; u < nu; u++)
        for (v = 0; v < nv; v++) {
            const int64_t e = 2 * (u * su + v);
            re += p[e] * q[e] + p[e + 1] * q[e + 1];
            im += p[e + 1] * q[e] - p[e] * q[e + 1];
        }
    out[0] = re;
    out[1] = im;
}

/* Site s's tensor A[l][a][r] of the sample at g (the lane layout: entry e = (l * 2 + a) * D[s+1] + r
   at g[off[s] + e * 2NJ], its imaginary part NJ further) into A, interleaved. */
static void qk__pq_site(const qk__mps_prog *p, const double *g, int s, double *A)
{
    const int64_t ne = 2 * (int64_t)p->D[s] * p->D[s + 1];
    const double *t = g + p->off[s];
    int64_t e;
    for (e = 0; e < ne; e++) {
        A[2 * e] = t[e * 2 * QK__NJ];
        A[2 * e + 1] = t[e * 2 * QK__NJ + QK__NJ];
    }
}

static void qk__pq_mps_work(void *arg, int thread)
{
    qk__pq_mps_job *j = (qk__pq_mps_job *)arg;
    const qk__mps_prog *p = j->p;
    const int q = p->q;
    int dmax = 1, s;
    int64_t i, *loff, tot = 0;
    double *L, *R, *Rn, *X, *W, *A;
    QK__UNUSED(thread);
    for (s = 0; s <= q; s++) if (p->D[s] > dmax) dmax = p->D[s];
    loff = (int64_t *)qk__malloc(sizeof(int64_t) * (size_t)(q + 1));
    if (!loff) { QK__STORE(&j->oom, 1); return; }
    for (s = 0; s <= q; s++) { loff[s] = tot; tot += 2 * (int64_t)p->D[s] * p->D[s]; }
    /* the left environments, then R and Rn (dmax^2 complex each), X, W and A (2 dmax^2 each) */
    L = (double *)qk__malloc(sizeof(double) * (size_t)(tot + 16 * dmax * dmax));
    if (!L) { QK_FREE(loff); QK__STORE(&j->oom, 1); return; }
    R = L + tot;
    Rn = R + 2 * dmax * dmax;
    X = Rn + 2 * dmax * dmax;
    W = X + 4 * dmax * dmax;
    A = W + 4 * dmax * dmax;
    while ((i = QK__FETCH_ADD(&j->next, 1)) < j->n) {
        const double *g = j->lanes + (i / QK__NJ) * p->group + (i % QK__NJ);
        double *f = j->f + i * 3 * q, *sw;
        int l, lp, a, ap, r, rp, c;
        L[0] = 1; L[1] = 0;
        for (s = 0; s < q; s++) {   /* L_{s+1}[r][r'] = sum_{l,l',a} L_s[l][l'] A[l][a][r] conj(A[l'][a][r']) */
            const int dl = p->D[s], dr = p->D[s + 1];
            const double *Ls = L + loff[s];
            double *Ln = L + loff[s + 1];
            qk__pq_site(p, g, s, A);
            /* X[l'][a][r] = sum_l L_s[l][l'] A[l][a][r] (c = a * dr + r) */
            for (lp = 0; lp < dl; lp++)
                for (c = 0; c < 2 * dr; c++) qk__cdot(Ls + 2 * lp, dl, A + 2 * c, 2 * dr, dl, X + 2 * (lp * 2 * dr + c));
            /* X[l'][a][r] conj(A[l'][a][r']) over (l', a) */
            for (r = 0; r < dr; r++)
                for (rp = 0; rp < dr; rp++) qk__cdot_conj(X + 2 * r, A + 2 * rp, 2 * dl, dr, 1, Ln + 2 * (r * dr + rp));
        }
        R[0] = 1; R[1] = 0;
        for (s = q - 1; s >= 0; s--) {
            const int dl = p->D[s], dr = p->D[s + 1], k = p->order[s];
            const double *Ls = L + loff[s];
            double rho[8], tr;
            qk__pq_site(p, g, s, A);
            /* X[l][a][r'] = sum_r A[l][a][r] R[r][r'] (c = l * 2 + a) */
            for (c = 0; c < 2 * dl; c++)
                for (rp = 0; rp < dr; rp++) qk__cdot(A + 2 * c * dr, 1, R + 2 * rp, dr, dr, X + 2 * (c * dr + rp));
            /* W[l'][a][r'] = sum_l L_s[l][l'] X[l][a][r'] (c = a * dr + r') */
            for (lp = 0; lp < dl; lp++)
                for (c = 0; c < 2 * dr; c++) qk__cdot(Ls + 2 * lp, dl, X + 2 * c, 2 * dr, dl, W + 2 * (lp * 2 * dr + c));
            /* rho[a][a'] = sum_{l',r'} W[l'][a][r'] conj(A[l'][a'][r']) */
            for (a = 0; a < 2; a++)
                for (ap = 0; ap < 2; ap++) qk__cdot_conj(W + 2 * a * dr, A + 2 * ap * dr, dl, 2 * dr, dr, rho + 2 * (a * 2 + ap));
            tr = rho[0] + rho[6];
            if (!(tr > 0)) tr = 1.0;
            f[3 * k] = rho[0] / tr;
            f[3 * k + 1] = rho[2] / tr;
            f[3 * k + 2] = rho[3] / tr;
            /* R_s[l][l'] = sum_{a,r'} X[l][a][r'] conj(A[l'][a][r']) */
            for (l = 0; l < dl; l++)
                for (lp = 0; lp < dl; lp++) qk__cdot_conj(X + 4 * l * dr, A + 4 * lp * dr, 1, 0, 2 * dr, Rn + 2 * (l * dl + lp));
            sw = R; R = Rn; Rn = sw;
        }
    }
    QK_FREE(L);
    QK_FREE(loff);
}

/* The MPS path's features of n samples into f (n x 3q); QK_OK or the error set. */
static qk_result qk__pq_mps_features(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int nt, double *f)
{
    const int64_t chunk = 512;
    int64_t i0;
    for (i0 = 0; i0 < n; i0 += chunk) {
        const int64_t c = n - i0 < chunk ? n - i0 : chunk;
        qk__pq_mps_job j;
        double *lanes = qk__mps_states(p, m, x + i0 * m->n_features, c, nt, NULL, NULL, NULL);
        if (!lanes) return QK_ERROR_OUT_OF_MEMORY;   /* the error set */
        memset(&j, 0, sizeof j);
        j.p = p; j.lanes = lanes; j.n = c; j.f = f + i0 * 3 * p->q;
        qk__parallel(nt < c ? nt : (int)c, qk__pq_mps_work, &j);
        QK_FREE(lanes);
        if (j.oom) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the environments of %d sites", p->q);
    }
    return QK_OK;
}

static double *qk__pq_features(const qk_map *m, const double *x, int64_t n, int nt)
{
    qk__pq_job j;
    memset(&j, 0, sizeof j);
    j.map = m; j.x = x; j.n = n; j.product = m->cls == QK_CLASS_PRODUCT;
    j.f = (double *)qk__malloc(sizeof(double) * (size_t)(n * 3 * m->n_qubits));
    if (!j.f) return NULL;
    qk__parallel(nt < n ? nt : (int)n, qk__pq_work, &j);
    if (j.oom) { QK_FREE(j.f); return NULL; }
    return j.f;
}

#if defined(QK_CUDA) && QK_CUDA
/* The GPU engine's projected kernel (src/cuda/projected.cuh), the context's first GPU: the MPS
   path's MPS built here (the provider below: the CPU path's builder, chunk by chunk, on the
   context's threads), its sweeps on the device; the statevector path wholly on the device; product
   maps' features here (cheap: 3q numbers a sample off q 2-vectors), their RBF on the device. */
typedef struct qk__pq_prov {
    const qk__mps_prog *p;
    const qk_map *m;
    const qk_gram_desc *desc;
    int nt;
    double *cur;                /* the last chunk's MPS (lane layout) */
} qk__pq_prov;

static qk_result qk__pq_build(int side, int64_t r0, int64_t r1, const double **lanes, void *user)
{
    qk__pq_prov *v = (qk__pq_prov *)user;
    const double *x = (side ? v->desc->y : v->desc->x) + r0 * v->m->n_features;
    QK_FREE(v->cur);
    v->cur = qk__mps_states(v->p, v->m, x, r1 - r0, v->nt, NULL, NULL, NULL);
    if (!v->cur) return QK_ERROR_OUT_OF_MEMORY;   /* the error set */
    *lanes = v->cur;
    return QK_OK;
}

static qk_result qk__pq_cuda(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma, const qk__mps_prog *prog, int nt)
{
    char err[512] = "";
    qk_cuda_pq src;
    qk__pq_prov pv;
    qk_result r;
    double *fx = NULL, *fy = NULL;
    memset(&src, 0, sizeof src);
    memset(&pv, 0, sizeof pv);
    if (map->cls == QK_CLASS_PRODUCT) {
        fx = qk__pq_features(map, desc->x, desc->n_x, nt);
        if (fx && desc->y) fy = qk__pq_features(map, desc->y, desc->n_y, nt);
        if (!fx || (desc->y && !fy)) {
            QK_FREE(fx);
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                            (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), map->n_qubits);
        }
        src.fx = fx;
        src.fy = fy;
    } else if (prog) {
        pv.p = prog; pv.m = map; pv.desc = desc; pv.nt = nt;
        src.mps = 1;
        src.n_sites = prog->q;
        src.nj = QK__NJ;
        src.D = prog->D;
        src.order = prog->order;
        src.off = prog->off;
        src.group = prog->group;
        src.chunk = 512;   /* as the CPU path: host memory O(chunk) in the MPS */
        src.build = qk__pq_build;
        src.user = &pv;
    } else
        src.real = qk__vjp_is_real(map);
    r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
    if (r == QK_OK) r = qk_cuda_gram_projected(map, desc, gamma, &src, qk__cuda_pool(ctx, 0), err, sizeof err);
    QK_FREE(pv.cur);
    QK_FREE(fx);
    QK_FREE(fy);
    if (r == QK_OK) return QK_OK;
    return err[0] ? qk__fail(r, "%s", err) : r;   /* empty: the provider's error, already set */
}
#endif

QKDEF qk_result qk_gram_projected(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, double gamma)
{
    qk_result r;
    double *fx = NULL, *fy = NULL;
    int64_t i, c, cols, ld;
    int q, nt, k, use_mps = 0;
    qk__mps_prog prog;
    if (!ctx || !map || !desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: NULL %s", !ctx ? "ctx" : !map ? "map" : "desc");
    if (!(gamma > 0.0 && gamma < 1e300)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: gamma must be finite and > 0 (got %g)", gamma);
    if (desc->output != QK_OUTPUT_HOST || !desc->out)
        return qk__fail(desc->output != QK_OUTPUT_HOST ? QK_ERROR_UNSUPPORTED : QK_ERROR_INVALID_ARGUMENT,
                        "qk_gram_projected: %s", desc->output != QK_OUTPUT_HOST ? "K goes to a host buffer (output HOST)" : "out is NULL");
    if (qk__map_is_states(map)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_projected: takes a feature map");
    q = map->n_qubits;
    r = qk__check_gram(ctx, map, desc);
    if (r != QK_OK) return r;
    /* the path: product maps analytic; entangling maps the MPS path where qk_gram would take it
       (beyond QK_MAX_STATE_QUBITS, or cheaper, or asked for: qk__mps_decide), else the statevector */
    memset(&prog, 0, sizeof prog);
    if (map->cls != QK_CLASS_PRODUCT) {
        r = qk__mps_decide_cpu(map, desc, &prog, &use_mps);
        if (r != QK_OK) return r;
    }
    cols = desc->y ? desc->n_y : desc->n_x;
    ld = desc->ld_out ? desc->ld_out : cols;
    nt = ctx->desc.n_threads > 0 ? ctx->desc.n_threads : qk__ncores();
#if defined(QK_CUDA) && QK_CUDA
    if (ctx->desc.device == QK_DEVICE_CUDA) {
        r = qk__pq_cuda(ctx, map, desc, gamma, use_mps ? &prog : NULL, nt);
        qk__mps_prog_free(&prog);
        return r;
    }
#endif
    if (use_mps) {
        fx = (double *)qk__malloc(sizeof(double) * (size_t)(desc->n_x * 3 * q));
        fy = desc->y ? (double *)qk__malloc(sizeof(double) * (size_t)(desc->n_y * 3 * q)) : NULL;
        r = !fx || (desc->y && !fy) ? QK_ERROR_OUT_OF_MEMORY : qk__pq_mps_features(&prog, map, desc->x, desc->n_x, nt, fx);
        if (r == QK_OK && desc->y) r = qk__pq_mps_features(&prog, map, desc->y, desc->n_y, nt, fy);
        qk__mps_prog_free(&prog);
        if (r != QK_OK) {
            QK_FREE(fx);
            QK_FREE(fy);
            if (r == QK_ERROR_OUT_OF_MEMORY && (!fx || (desc->y && !fy)))
                return qk__fail(r, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                                (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), q);
            return r;
        }
    } else {
        fx = qk__pq_features(map, desc->x, desc->n_x, nt);
        if (fx && desc->y) fy = qk__pq_features(map, desc->y, desc->n_y, nt);
    }
    if (!fx || (desc->y && !fy)) {
        QK_FREE(fx);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_projected: cannot allocate the reduced density matrices (%lld samples x %d qubits)",
                        (long long)(desc->n_x + (desc->y ? desc->n_y : 0)), q);
    }
    for (i = 0; i < desc->n_x; i++) {
        const double *a = fx + i * 3 * q;
        for (c = desc->y ? 0 : i; c < cols; c++) {
            const double *b = (desc->y ? fy : fx) + c * 3 * q;
            double d2 = 0, v;
            for (k = 0; k < 3 * q; k++) d2 += (a[k] - b[k]) * (a[k] - b[k]);
            v = exp(-2.0 * gamma * d2);
            if (desc->out_dtype == QK_F32) {
                ((float *)desc->out)[i * ld + c] = (float)v;
                if (!desc->y) ((float *)desc->out)[c * ld + i] = (float)v;
            } else {
                ((double *)desc->out)[i * ld + c] = v;
                if (!desc->y) ((double *)desc->out)[c * ld + i] = v;
            }
        }
    }
    QK_FREE(fx);
    QK_FREE(fy);
    return QK_OK;
}
/* >>mpi_impl ---- qk_gram_mpi: K over the ranks of an MPI communicator ---- */
#if defined(QK_MPI)
/* qk_gram_mpi: every rank checks the request, the ranks agree (sizes, dtype, a checksum of the
   data), the rows are dealt by qk_schedule_make, and each rank runs its band in blocks: for
   slab rows [a, b) of K(X,X) the symmetric sub-job K(X[a:b]) and the rectangles
   K(X[a:b], X[c:c+w]) for c >= b (the same orientation as qk_gram's upper-triangle tiles, so the
   same bits), each into a host buffer that goes to the file as row pieces and, transposed, as
   the mirror below the diagonal. Between blocks a rank looks (MPI_Iprobe) for a failure notice
   from another rank and stops; failures are announced with non-blocking sends and every phase
   ends in qk__mpi_decide, a collective that hands every rank the first failing rank's result. */
#ifndef QK_MPI_BLOCK_BYTES
#define QK_MPI_BLOCK_BYTES ((size_t)512 << 20)
#endif
#define QK__MPI_TAG_FAIL 7117
/* The writer thread syncs the file every QK_MPI_SYNC_BYTES it wrote, as the streaming .npy
   writer's syncer does (and for the same reason: the kernel starts writing back only at
   dirty_background_ratio, so without it a K smaller than a tenth of RAM reaches the disk only
   in the final sync, after the compute); the compute goes on meanwhile. */
#ifndef QK_MPI_SYNC_BYTES
#define QK_MPI_SYNC_BYTES ((uint64_t)256 << 20)
#endif
#define QK__MPI_SYNC_BYTES ((uint64_t)(QK_MPI_SYNC_BYTES))


typedef struct qk__mpi {
    MPI_Comm comm;          /* a duplicate of the caller's: our messages never meet theirs */
    int rank, size;
    int announced;          /* this rank sent its failure notice */
    int fail_code;          /* the notice's payload (alive until the sends complete) */
    int n_reqs;
    MPI_Request *reqs;      /* size - 1 sends */
} qk__mpi;

/* Tells every other rank that this one failed (non-blocking; qk__mpi_decide completes it). */
static void qk__mpi_announce(qk__mpi *m, qk_result r)
{
    int k;
    if (m->announced || !m->reqs) return;
    m->fail_code = (int)r;
    m->n_reqs = 0;
    for (k = 0; k < m->size; k++)
        if (k != m->rank) MPI_Isend(&m->fail_code, 1, MPI_INT, k, QK__MPI_TAG_FAIL, m->comm, &m->reqs[m->n_reqs++]);
    m->announced = 1;
}

static int qk__mpi_remote_failed(qk__mpi *m)
{
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, QK__MPI_TAG_FAIL, m->comm, &flag, MPI_STATUS_IGNORE);
    return flag;
}

/* Collective. r is this rank's result (its detail in qk_last_error). Returns QK_OK when every
   rank succeeded, else on every rank the lowest failing rank's result and detail. Receives the
   failure notices sent so far, so that none is left pending. */
static qk_result qk__mpi_decide(qk__mpi *m, qk_result r)
{
    int key = r != QK_OK ? m->rank : m->size, first = m->size, ann = 0, k;
    struct { int code; char msg[sizeof qk__errbuf]; } e;
    MPI_Allreduce(&key, &first, 1, MPI_INT, MPI_MIN, m->comm);
    MPI_Allreduce(&m->announced, &ann, 1, MPI_INT, MPI_SUM, m->comm);
    for (k = 0; k < ann - m->announced; k++) {
        int c;
        MPI_Recv(&c, 1, MPI_INT, MPI_ANY_SOURCE, QK__MPI_TAG_FAIL, m->comm, MPI_STATUS_IGNORE);
    }
    if (m->announced) MPI_Waitall(m->n_reqs, m->reqs, MPI_STATUSES_IGNORE);
    m->announced = 0;
    m->n_reqs = 0;
    if (first >= m->size) return QK_OK;
    memset(&e, 0, sizeof e);
    if (m->rank == first) {
        e.code = (int)r;
        snprintf(e.msg, sizeof e.msg, "%s", qk__errbuf);
    }
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, m->comm);
    if (m->size == 1) return qk__fail((qk_result)e.code, "%s", e.msg);
    return qk__fail((qk_result)e.code, "rank %d of %d: %s", first, m->size, e.msg);
}

/* 64-bit FNV-1a over 8-byte words (the ranks compare their inputs with it) */
static uint64_t qk__hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        h = (h ^ v) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t qk__hash_map(const qk_map *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int v[4], i;
    v[0] = (int)m->type; v[1] = m->n_qubits; v[2] = m->n_features; v[3] = m->n_ops;
    h = qk__hash(h, v, sizeof v);
    for (i = 0; i < m->n_ops; i++) {   /* field by field: struct padding is not data */
        const qk_op *o = &m->ops[i];
        int f[7];
        double g[2];
        f[0] = (int)o->kind; f[1] = o->q0; f[2] = o->q1; f[3] = (int)o->angle.kind;
        f[4] = o->angle.x0; f[5] = o->angle.x1; f[6] = o->angle.w;
        g[0] = o->angle.scale; g[1] = o->angle.offset;
        h = qk__hash(h, f, sizeof f);
        h = qk__hash(h, g, sizeof g);
    }
    if (m->n_weights > 0 && m->weights) h = qk__hash(h, m->weights, sizeof(double) * (size_t)m->n_weights);
    return h;
}

/* n rows of row_bytes bytes, stride bytes apart (given states: a row's padding is not data) */
static uint64_t qk__hash_rows(const void *x, int64_t n, size_t stride, size_t row_bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t i;
    if (row_bytes == stride) return qk__hash(h, x, stride * (size_t)n);
    for (i = 0; i < n; i++) h = qk__hash(h, (const char *)x + (size_t)i * stride, row_bytes);
    return h;
}

/* A provider's rows on this rank (qk_gram_mpi_states): the hash of each row the provider gave
   (0: never asked for), A's n_a rows then B's. A row asked for again (another block) must hash
   the same; after the bands the ranks compare the rows more than one of them asked for. */
typedef struct qk__mpi_rows {
    uint64_t *h, *tmp;      /* n hashes; tmp: a piece of them for the comparison */
    int64_t n_a, n, piece;
    size_t row_bytes;       /* a row's elements, not its padding */
} qk__mpi_rows;

/* sm->rows_fn: each chunk the provider gave (checked), hashed row by row */
static qk_result qk__mpi_rows_seen(void *user, int side, int64_t row0, int64_t n, const void *rows, int64_t ld_bytes)
{
    qk__mpi_rows *t = (qk__mpi_rows *)user;
    int64_t i;
    for (i = 0; i < n; i++) {
        const int64_t k = (side ? t->n_a : 0) + row0 + i;
        uint64_t v = qk__hash(0xcbf29ce484222325ull, (const char *)rows + i * ld_bytes, t->row_bytes);
        if (v == 0) v = 1;
        if (t->h[k] == 0) t->h[k] = v;
        else if (t->h[k] != v)
            return qk__fail(QK_ERROR_BAD_DATA, "qk_gram_mpi_states: the state provider gave %s[%lld] twice, different each time (it "
                            "must give the same row for an index, to every request on every rank)", side ? "B" : "A", (long long)(row0 + i));
    }
    return QK_OK;
}

/* Collective, after every rank's band succeeded: the rows that several ranks asked for must be
   the same on each (the lowest and highest hash of each row over the ranks that asked for it).
   The same result on every rank (the reductions give every rank the same arrays). */
static qk_result qk__mpi_rows_agree(MPI_Comm comm, qk__mpi_rows *t)
{
    int64_t o, k;
    for (o = 0; o < t->n; o += t->piece) {
        const int64_t c = t->n - o < t->piece ? t->n - o : t->piece;
        for (k = 0; k < c; k++) t->tmp[k] = t->h[o + k] ? t->h[o + k] : UINT64_MAX;
        MPI_Allreduce(MPI_IN_PLACE, t->tmp, (int)c, MPI_UINT64_T, MPI_MIN, comm);
        MPI_Allreduce(MPI_IN_PLACE, t->h + o, (int)c, MPI_UINT64_T, MPI_MAX, comm);
        for (k = 0; k < c; k++)
            if (t->h[o + k] != 0 && t->tmp[k] != t->h[o + k]) {
                const int64_t row = o + k;
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram_mpi_states: the ranks' state providers gave different rows for %s[%lld] "
                                "(a provider must give the same row for an index on every rank); nothing was written",
                                row >= t->n_a ? "B" : "A", (long long)(row >= t->n_a ? row - t->n_a : row));
            }
    }
    return QK_OK;
}

/* One rank's band of rows. */
typedef struct qk__mpi_band {
    qk__mpi *m;
    qk_ctx *ctx;
    const qk_map *map;
    qk__smap *sm;           /* given states (qk_gram_mpi_states), else NULL */
    const qk_gram_desc *desc;
    qk_dtype dt;
    size_t es;
    int64_t n, cols;        /* K is n x cols */
    int symmetric;
    MPI_File fh;            /* NPY: this rank's handle on the temporary file */
    const char *path;
    uint64_t hdr, written;
    uint64_t synced;        /* written bytes at the last periodic sync */
    int sync_often;         /* the writer thread syncs every mpi_sync_bytes (see above) */
    int64_t done, total;    /* this rank's entries of K, for the progress callback */
    int64_t scale;          /* entries per pair of the running sub-job (2: its mirror too) */
    int64_t di, dj;         /* the running sub-job's origin in K */
    int remote_stop;        /* another rank's failure notice, seen during a sub-job (qk__mpi_poll) */
    qk__thread caller;      /* the thread that called qk_gram_mpi (qk_gram's thread 0) */
    qk__mutex mpi_lock;     /* held by the writer thread while it is inside MPI */
} qk__mpi_band;

/* Inside a sub-job (from its progress polls): has another rank failed? Then the sub-job is
   cancelled, so that one rank's stop (a signal, an error) reaches every rank within a poll, not
   at the end of its block. Only the calling thread asks MPI, and only while the writer thread is
   outside MPI (MPI_THREAD_SERIALIZED: one thread in MPI at a time; FUNNELED / SINGLE: the main
   thread). */
static int qk__mpi_poll(qk__mpi_band *b)
{
    if (!qk__thread_is_self(b->caller)) return 0;
    if (b->remote_stop) return 1;
    if (!qk__mutex_trylock(&b->mpi_lock)) return 0;
    if (qk__mpi_remote_failed(b->m)) b->remote_stop = 1;
    qk__mutex_unlock(&b->mpi_lock);
    return b->remote_stop;
}

static int qk__mpi_progress(int64_t done, int64_t total, void *user)
{
    qk__mpi_band *b = (qk__mpi_band *)user;
    QK__UNUSED(total);
    if (qk__mpi_poll(b)) return 1;
    return b->desc->progress ? b->desc->progress(b->done + b->scale * done, b->total, b->desc->progress_user) : 0;
}

static int qk__mpi_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    qk__mpi_band *b = (qk__mpi_band *)user;
    return b->desc->tile_fn(i0 + b->di, j0 + b->dj, m, n, tile, ld, b->desc->tile_user);
}

/* n bytes at offset off of the file (MPI counts are int: pieces of at most 1 GB). A short write
   (some bytes, not all: a write that straddles RLIMIT_FSIZE or fills the disk) is continued, as
   write(2) is; the next write then fails with the reason (EFBIG and SIGXFSZ, ENOSPC). */
static qk_result qk__mpi_write(qk__mpi_band *b, uint64_t off, const char *p, size_t n)
{
    while (n > 0) {
        int c = n > ((size_t)1 << 30) ? (1 << 30) : (int)n, got = 0, e, len = 0;
        char msg[MPI_MAX_ERROR_STRING + 1];
        MPI_Status st;
        e = MPI_File_write_at(b->fh, (MPI_Offset)off, p, c, MPI_BYTE, &st);
        if (e == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &got);
        if (e == MPI_SUCCESS && got > 0 && got < c) c = got;   /* short: the rest on the next pass */
        else if (e != MPI_SUCCESS || got != c) {
            if (e != MPI_SUCCESS) MPI_Error_string(e, msg, &len);
            else len = snprintf(msg, sizeof msg, "%d of %d bytes written", got, c);
            msg[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = 0;
            return qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_write_at of %.3g MB at byte %llu failed: %s",
                            b->path, (double)c * 1e-6, (unsigned long long)off, msg);
        }
        off += (uint64_t)c;
        p += c;
        n -= (size_t)c;
        b->written += (uint64_t)c;
    }
    return QK_OK;
}

/* K[di .. di + nx) x [dj .. dj + ny) with qk_gram, of rows X[di ..] and Y[dj ..] (Y is X for
   symmetric K); ny 0: the symmetric K(X[di .. di + nx)); into out (ld) for NPY, else through the
   caller's tile callback. scale: entries of K per computed pair. A provider's tags are pointed
   at the two blocks of rows (qk__smap: side and first row); device states are offset in place. */
static qk_result qk__mpi_sub(qk__mpi_band *b, int64_t di, int64_t nx, int64_t dj, int64_t ny, void *out, int64_t ld, int64_t scale)
{
    const double *X = b->desc->x, *Y = b->desc->y ? b->desc->y : b->desc->x;
    const int64_t d = b->map->n_features;
    qk__smap *sm = b->sm;
    qk_gram_desc g;
    qk_result r;
    memset(&g, 0, sizeof g);
    if (sm && (sm->op.q1 & QK__STATE_PROVIDER)) {
        sm->tag_side[0] = 0;
        sm->tag_row0[0] = di;
        sm->tag_side[1] = b->symmetric ? 0 : 1;
        sm->tag_row0[1] = dj;
        g.x = (const double *)(const void *)&sm->side[0];
        g.y = ny ? (const double *)(const void *)&sm->side[1] : NULL;
    } else {
        g.x = X + di * d;
        g.y = ny ? Y + dj * d : NULL;
    }
    /* the caller's split over the rank's GPUs (a provider's desc keeps one GPU: qk__smap_make) */
    g.mgpu_min_pairs = b->desc->mgpu_min_pairs;
    g.mgpu_host_bound_split = b->desc->mgpu_host_bound_split;
    g.n_x = nx;
    g.n_y = ny;
    g.precision = b->desc->precision;
    g.path = b->desc->path;
    g.out_dtype = b->dt;
    if (b->desc->output == QK_OUTPUT_NPY) {
        g.output = QK_OUTPUT_HOST;
        g.out = out;
        g.ld_out = ld;
    } else {
        g.output = QK_OUTPUT_CALLBACK;
        g.tile_fn = qk__mpi_tile;
        g.tile_user = b;
    }
    g.progress = qk__mpi_progress;   /* the caller's, and the look for another rank's failure */
    g.progress_user = b;
    b->scale = scale;
    b->di = di;
    b->dj = ny ? dj : di;
    r = qk_gram(b->ctx, b->map, &g);
    b->done += scale * nx * (ny ? ny : nx);
    if (r != QK_OK && sm && sm->provider_failed) return r;   /* the provider's failure, or its bad rows (detail set) */
    if (r == QK_ERROR_CANCELLED && b->remote_stop) return r;   /* not this rank's failure */
    if (r == QK_ERROR_CANCELLED)   /* qk_gram's detail speaks of its own output, a block here */
        return qk__fail(r, "qk_gram_mpi: cancelled by a %s callback after %lld of this rank's %lld entries of K%s%s%s",
                        b->desc->output == QK_OUTPUT_NPY ? "progress" : "progress or tile", (long long)b->done, (long long)b->total,
                        b->desc->output == QK_OUTPUT_NPY ? "; '" : "", b->desc->output == QK_OUTPUT_NPY ? b->path : "",
                        b->desc->output == QK_OUTPUT_NPY ? "' was not written" : "");
    return r;
}

/* One computed block, K[a .. a + h)[c0 .. c0 + w) in U (ld w), to the file: its rows, and for
   symmetric K off the diagonal its mirror K[c][a .. a + h) for c in [c0, c0 + w), transposed
   through tb 64 rows of K at a time. */
typedef struct qk__mpi_block {
    qk__mpi_band *b;
    const char *U;
    char *tb;
    int64_t a, h, c0, w;
    int mirror;
    qk_result r;
    char err[sizeof qk__errbuf];
} qk__mpi_block;

static void *qk__mpi_block_write(void *p)
{
    qk__mpi_block *s = (qk__mpi_block *)p;
    qk__mpi_band *b = s->b;
    const int64_t n = b->cols, a = s->a, h = s->h, c0 = s->c0, w = s->w;
    const size_t es = b->es;
    int64_t i, c, k;
    qk_result r = QK_OK;
    qk__mutex_lock(&b->mpi_lock);
    QK_PROF_BEGIN("mpi write");
    if (c0 == 0 && w == n) r = qk__mpi_write(b, b->hdr + (uint64_t)a * (uint64_t)n * es, s->U, (size_t)(h * w) * es);
    else
        for (i = 0; i < h && r == QK_OK; i++)
            r = qk__mpi_write(b, b->hdr + ((uint64_t)(a + i) * (uint64_t)n + (uint64_t)c0) * es, s->U + (size_t)(i * w) * es, (size_t)w * es);
    for (k = 0; s->mirror && k < w && r == QK_OK; k += 64) {
        int64_t nc = w - k < 64 ? w - k : 64;
        for (i = 0; i < h; i++)
            for (c = 0; c < nc; c++)
                memcpy(s->tb + (size_t)(c * h + i) * es, s->U + (size_t)(i * w + k + c) * es, es);
        for (c = 0; c < nc && r == QK_OK; c++)
            r = qk__mpi_write(b, b->hdr + ((uint64_t)(c0 + k + c) * (uint64_t)n + (uint64_t)a) * es, s->tb + (size_t)(c * h) * es, (size_t)h * es);
    }
    if (r == QK_OK && b->sync_often && b->written - b->synced >= (b->desc->mpi_sync_bytes ? (uint64_t)b->desc->mpi_sync_bytes : QK__MPI_SYNC_BYTES)) {
        if (MPI_File_sync(b->fh) != MPI_SUCCESS) r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_sync failed", b->path);
        b->synced = b->written;
    }
    QK_PROF_END("mpi write");
    qk__mutex_unlock(&b->mpi_lock);
    s->r = r;
    if (r != QK_OK) snprintf(s->err, sizeof s->err, "%s", qk__errbuf);   /* the detail is thread-local */
    return NULL;
}

/* Rows [r0, r1) of K in blocks of at most mpi_block_bytes (QK_MPI_BLOCK_BYTES): rows in slabs of S, each slab's
   columns (from its diagonal for symmetric K) in chunks of C, S and C about the square root of
   the budget so that the file writes of a block's rows (C elements) and of its mirror (S
   elements) are both long, and each block builds only S + C states. The diagonal block of a
   slab is a symmetric sub-job. NPY: two block buffers; a writer thread writes block k while the
   engine computes block k + 1, when MPI allows MPI-IO from a second thread (the library provides
   MPI_THREAD_SERIALIZED or more: only one of the two threads is ever inside MPI, as the failure
   check between blocks runs after the writer is joined); else each block is written before the
   next is computed. Another rank's failure notice stops it (returning QK_OK: that rank's result
   is the job's). A provider's rows (qk_gram_mpi_states): each slab's rows are asked for once, at
   the slab's start, and kept for its blocks (sm->cache), where a slab's rows fit the same budget
   (S rows of the states' stored row, at most mpi_block_bytes more per rank); else, and for the
   blocks' column rows, each block asks for its rows. */
static qk_result qk__mpi_run_band(qk__mpi_band *b, int64_t r0, int64_t r1)
{
    const int npy = b->desc->output == QK_OUTPUT_NPY;
    const int64_t cols = b->cols;
    const size_t es = b->es, budget = b->desc->mpi_block_bytes ? b->desc->mpi_block_bytes : (size_t)(QK_MPI_BLOCK_BYTES);
    qk__smap *sm = b->sm && (b->sm->op.q1 & QK__STATE_PROVIDER) ? b->sm : NULL;
    int64_t S, C, a, bnd, c0, k = 0;
    char *U[2] = {NULL, NULL}, *tb = NULL, *cache = NULL;
    qk__mpi_block sw;
    qk_result r = QK_OK;
    int threaded = 0, pending = 0, level = MPI_THREAD_SINGLE, stop = 0;
    qk__thread wt;
    MPI_Query_thread(&level);
    threaded = QK__THREADS && level >= MPI_THREAD_SERIALIZED;
    b->sync_often = threaded && npy && !b->desc->no_sync;
    memset(&sw, 0, sizeof sw);
    if (r1 <= r0) return QK_OK;
    S = (int64_t)sqrt((double)(budget / es));
    if (S >= 64) S = S / 64 * 64;        /* whole tiles of the CPU engine */
    if (S < 1) S = 1;
    if (S > r1 - r0) S = r1 - r0;
    C = (int64_t)(budget / es) / S;
    if (C >= 64) C = C / 64 * 64;
    if (C < S) C = S;                    /* the symmetric diagonal block fits */
    if (C > cols) C = cols;
    for (b->total = 0, a = r0; a < r1; a = bnd) {
        int64_t h;
        bnd = r1 - a < S ? r1 : a + S;
        h = bnd - a;
        b->total += b->symmetric ? h * h + 2 * h * (cols - bnd) : h * cols;
    }
    if (npy) {
        U[0] = (char *)qk__malloc((size_t)S * (size_t)C * es);
        U[1] = threaded ? (char *)qk__malloc((size_t)S * (size_t)C * es) : U[0];
        tb = b->symmetric ? (char *)qk__malloc((size_t)S * 64 * es) : NULL;
        if (!U[0] || !U[1] || (b->symmetric && !tb)) {
            r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mpi: cannot allocate %d blocks of %lld x %lld (mpi_block_bytes, QK_MPI_BLOCK_BYTES)", threaded ? 2 : 1, (long long)S, (long long)C);
            goto done;
        }
    }
    /* a slab's provider rows, kept for its blocks where they fit the budget (an allocation that
       fails only means that each block asks for its rows) */
    if (sm && (double)S * (double)sm->map.n_features * 8.0 <= (double)budget)
        cache = (char *)qk__malloc((size_t)S * (size_t)sm->map.n_features * 8);
    for (a = r0; a < r1 && !stop; a = bnd) {
        int64_t h, i;
        bnd = r1 - a < S ? r1 : a + S;
        h = bnd - a;
        if (cache) {   /* the slab's rows, asked for once (in the provider's chunks) */
            sm->cache = NULL;
            if (!pending && qk__mpi_remote_failed(b->m)) { stop = 1; break; }
            for (i = 0; i < h && r == QK_OK; i += sm->chunk)
                r = qk__smap_fetch(sm, 0, a + i, h - i < sm->chunk ? h - i : sm->chunk, cache + (size_t)i * (size_t)sm->map.n_features * 8);
            if (r != QK_OK) { stop = 1; break; }
            sm->cache = cache;
            sm->cache_side = 0;
            sm->cache_row0 = a;
            sm->cache_n = h;
        }
        /* the slab's blocks: the diagonal one (symmetric K), then column chunks */
        for (c0 = b->symmetric ? a : 0; c0 < cols && !stop; k++) {
            char *u = U[k & 1];
            const int diag = b->symmetric && c0 == a;
            const int64_t w = diag ? h : (cols - c0 < C ? cols - c0 : C);
            if (!pending && qk__mpi_remote_failed(b->m)) { stop = 1; break; }
            QK_PROF_BEGIN("mpi block");
            if (diag) r = qk__mpi_sub(b, a, h, a, 0, u, w, 1);
            else r = qk__mpi_sub(b, a, h, c0, w, u, w, b->symmetric ? 2 : 1);
            QK_PROF_END("mpi block");
            if (pending) {   /* the previous block's writer */
                qk__thread_join(wt);
                pending = 0;
                if (sw.r != QK_OK) { r = qk__fail(sw.r, "%s", sw.err); stop = 1; break; }
            }
            if (r == QK_ERROR_CANCELLED && b->remote_stop) { r = QK_OK; stop = 1; break; }   /* that rank's result is the job's */
            if (r != QK_OK) { stop = 1; break; }
            if (npy) {
                if (qk__mpi_remote_failed(b->m)) { stop = 1; break; }
                sw.b = b; sw.U = u; sw.tb = tb; sw.a = a; sw.h = h; sw.c0 = c0; sw.w = w;
                sw.mirror = b->symmetric && !diag;
                sw.r = QK_OK;
                if (threaded && qk__thread_start(&wt, qk__mpi_block_write, &sw)) pending = 1;
                else {
                    qk__mpi_block_write(&sw);
                    if (sw.r != QK_OK) { r = qk__fail(sw.r, "%s", sw.err); stop = 1; break; }
                }
            }
            c0 += w;
        }
    }
    if (pending) {
        qk__thread_join(wt);
        if (sw.r != QK_OK && r == QK_OK) r = qk__fail(sw.r, "%s", sw.err);
    }
done:
    if (sm) sm->cache = NULL;
    QK_FREE(cache);
    if (U[1] != U[0]) QK_FREE(U[1]);
    QK_FREE(U[0]);
    QK_FREE(tb);
    return r;
}

/* qk_gram_mpi's sink, the .npy written with MPI-IO: the temporary file, its rename and its
   removal are qk_gram's (qk__open_tmp, qk__tmp_commit, qk__tmp_discard), on rank 0; every rank
   writes through its own MPI handle. Collective: every rank calls open and close. */
typedef struct qk__mpi_sink {
    char *tmp;              /* the temporary's name (every rank) */
    MPI_File fh;            /* this rank's handle */
    int opened;
} qk__mpi_sink;

/* Rank 0 creates the temporary file, every rank opens it, rank 0 writes the header. Returns the
   ranks' agreed result (qk__mpi_decide). */
static qk_result qk__mpi_sink_open(qk__mpi *m, qk__mpi_band *b, qk__mpi_sink *s)
{
    const qk_gram_desc *desc = b->desc;
    size_t nbytes = 0;
    int len = 0;
    char hdr[192];
    qk_result r = QK_OK, rc;
    if (m->rank == 0) {
        int fd = -1;
        r = qk__npy_shape_bytes("qk_gram_mpi", b->dt, b->n, b->cols, &nbytes);
        if (r == QK_OK && sizeof(MPI_Offset) < 8) r = qk__fail(QK_ERROR_UNSUPPORTED, "qk_gram_mpi: MPI_Offset is narrower than 64 bits");
        if (r == QK_OK) r = qk__open_tmp(desc->out_path, &s->tmp, &fd);
        if (fd >= 0) (void)QK__CLOSE(fd);
        if (s->tmp) len = (int)strlen(s->tmp);
    }
    rc = qk__mpi_decide(m, r);
    if (rc != QK_OK) return rc;
    MPI_Bcast(&len, 1, MPI_INT, 0, m->comm);
    if (m->rank != 0) {
        s->tmp = (char *)qk__malloc((size_t)len + 1);
        r = s->tmp ? QK_OK : qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_gram_mpi: out of memory");
    }
    rc = qk__mpi_decide(m, r);
    if (rc != QK_OK) return rc;
    MPI_Bcast(s->tmp, len + 1, MPI_CHAR, 0, m->comm);
    {
        int e = MPI_File_open(MPI_COMM_SELF, s->tmp, MPI_MODE_WRONLY, MPI_INFO_NULL, &s->fh), elen = 0;
        char msg[MPI_MAX_ERROR_STRING + 1];
        if (e == MPI_SUCCESS) s->opened = 1;
        else {
            MPI_Error_string(e, msg, &elen);
            msg[elen < 0 ? 0 : elen > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : elen] = 0;
            r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_open of '%s' failed: %s (is the directory on a file system all ranks see?)",
                         desc->out_path, s->tmp, msg);
        }
    }
    b->fh = s->fh;
    b->hdr = (uint64_t)qk__npy_make_header(hdr, b->dt, b->n, b->cols);
    if (r == QK_OK && m->rank == 0) r = qk__mpi_write(b, 0, hdr, (size_t)b->hdr);
    return qk__mpi_decide(m, r);
}

/* After the bands (rc: the ranks' agreed result): sync (unless no_sync), close, check that every
   byte came, rename on rank 0. The temporary is removed by the caller when the result is not
   QK_OK. Returns the ranks' agreed result. */
static qk_result qk__mpi_sink_close(qk__mpi *m, qk__mpi_band *b, qk__mpi_sink *s, qk_result rc)
{
    const qk_gram_desc *desc = b->desc;
    uint64_t all = 0;
    qk_result r = QK_OK;
    if (rc == QK_OK && !desc->no_sync && MPI_File_sync(s->fh) != MPI_SUCCESS)
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_sync failed", desc->out_path);
    if (MPI_File_close(&s->fh) != MPI_SUCCESS && r == QK_OK)
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': MPI_File_close failed", desc->out_path);
    s->opened = 0;
    if (rc == QK_OK) {
        MPI_Allreduce(&b->written, &all, 1, MPI_UINT64_T, MPI_SUM, m->comm);
        if (r == QK_OK && m->rank == 0 && all != b->hdr + (uint64_t)b->n * (uint64_t)b->cols * b->es)
            r = qk__fail(QK_ERROR_IO, "cannot write '%s': %llu of %llu bytes were written (internal error)", desc->out_path,
                         (unsigned long long)all, (unsigned long long)(b->hdr + (uint64_t)b->n * (uint64_t)b->cols * b->es));
        rc = qk__mpi_decide(m, r);
    }
    if (rc == QK_OK) {
        r = m->rank == 0 ? qk__tmp_commit(s->tmp, desc->out_path, desc->no_sync) : QK_OK;
        rc = qk__mpi_decide(m, r);
    }
    return rc;
}

/* qk_gram_mpi and qk_gram_mpi_states. fn: the entry point's name for its messages. pre: the
   result of what the entry point did alone before (qk_gram_mpi_states: its states' map made and
   checked), decided with the ranks' first check, so that a failure there is every rank's (when
   pre is not QK_OK, map and desc are not read). sm: given states (NULL for a map): host rows
   are compared across ranks without their padding; a provider's rows as they come (each rank
   hashes the rows it was given, and the ranks compare the rows several asked for before the
   file is committed); device rows by dev_hash (their checksums on each rank's device). */
static qk_result qk__gram_mpi(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, MPI_Comm comm, const char *fn, qk_result pre,
                              qk__smap *sm, const uint64_t *dev_hash)
{
    static const char *sig_names[2][11] = {{"n_x", "n_y (K(X,X) or K(X,Y))", "the map's feature count", "output",
                                            "out_dtype", "precision", "no_sync", "the map", "the data X",
                                            "the data Y", "out_path"},
                                           {"n_a", "n_b (K(A,A) or K(A,B))", "the states' dim and type", "output",
                                            "out_dtype", "precision", "no_sync", "the states' type, dim, kind or normalize",
                                            "the states A", "the states B", "out_path"}};
    qk__mpi m;
    qk__mpi_band b;
    qk_schedule sch;
    qk_schedule_desc sd;
    qk_result r = QK_OK, rc;
    qk__mpi_sink snk;
    qk__mpi_rows rows;
    const int provider = sm && (sm->op.q1 & QK__STATE_PROVIDER);
    int inited = 0, finalized = 0, k, npy;
    int64_t sig[11], lo[11], hi[11];

    if (comm == MPI_COMM_NULL) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: comm is MPI_COMM_NULL", fn);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: MPI is %s", fn, finalized ? "finalized" : "not initialized (call MPI_Init first)");
    memset(&m, 0, sizeof m);
    memset(&b, 0, sizeof b);
    memset(&sch, 0, sizeof sch);
    memset(&snk, 0, sizeof snk);
    memset(&rows, 0, sizeof rows);
    snk.fh = MPI_FILE_NULL;
    MPI_Comm_dup(comm, &m.comm);
    MPI_Comm_rank(m.comm, &m.rank);
    MPI_Comm_size(m.comm, &m.size);
    m.reqs = (MPI_Request *)qk__malloc(sizeof(MPI_Request) * (size_t)m.size);

    /* 1. every rank checks the request (data included) */
    if (pre != QK_OK) r = pre;   /* its detail is still the one set */
    else if (!m.reqs) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
    else if (provider) {   /* a hash of each row the provider gives (qk__mpi_rows) */
        rows.n_a = sm->in.n_a;
        rows.n = sm->in.n_a + (desc->y ? sm->in.n_b : 0);
        rows.piece = rows.n < ((int64_t)1 << 22) ? rows.n : ((int64_t)1 << 22);
        rows.row_bytes = qk__state_row_bytes(&sm->op);
        rows.h = (uint64_t *)qk__calloc((size_t)rows.n, sizeof(uint64_t));
        rows.tmp = (uint64_t *)qk__malloc(sizeof(uint64_t) * (size_t)rows.piece);
        if (!rows.h || !rows.tmp) r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: cannot allocate the hashes of %lld provider rows", fn, (long long)rows.n);
        sm->rows_fn = qk__mpi_rows_seen;
        sm->rows_user = &rows;
    }
    if (r == QK_OK) r = qk__check_gram(ctx, map, desc);
    if (r == QK_OK && desc->output != QK_OUTPUT_NPY && desc->output != QK_OUTPUT_CALLBACK)
        r = qk__fail(QK_ERROR_UNSUPPORTED, "%s: output %s is not supported across ranks (use QK_OUTPUT_NPY or QK_OUTPUT_CALLBACK)",
                     fn, desc->output == QK_OUTPUT_DEVICE ? "DEVICE" : "HOST");
    rc = qk__mpi_decide(&m, r);
    if (rc != QK_OK) goto done;

    /* 2. the ranks agree on the job (else every rank fails the same way: no collective needed) */
    npy = desc->output == QK_OUTPUT_NPY;
    b.dt = desc->out_dtype ? desc->out_dtype
         : (qk__prec_f32(desc->precision) ||
            ((desc->precision == QK_PRECISION_DEFAULT || desc->precision == QK_PRECISION_AUTO) && qk_ctx_query(ctx).device == QK_DEVICE_CUDA &&
             qk__auto_precision(map, qk__path_of(map), desc->tol, 0, NULL, 0) != QK_PRECISION_FP64)) ? QK_F32 : QK_F64;
    sig[0] = desc->n_x;
    sig[1] = desc->y ? desc->n_y : -1;
    sig[2] = map->n_features;
    sig[3] = (int64_t)desc->output;
    sig[4] = (int64_t)b.dt;
    sig[5] = (int64_t)desc->precision;
    sig[6] = npy ? desc->no_sync != 0 : 0;
    {
        uint64_t h[4];
        h[0] = qk__hash_map(map);
        const size_t stride = sizeof(double) * (size_t)map->n_features;
        /* a given state's row: its elements (dim, or dim^2 for density matrices), not the padding */
        const size_t row = sm ? qk__state_row_bytes(&sm->op) : stride;
        if (provider) h[1] = h[2] = 0;   /* rows not yet given: compared as they come (qk__mpi_rows_agree) */
        else if (dev_hash) {
            h[1] = dev_hash[0];
            h[2] = desc->y ? dev_hash[1] : 0;
        } else {
            h[1] = qk__hash_rows(desc->x, desc->n_x, stride, row);
            h[2] = desc->y ? qk__hash_rows(desc->y, desc->n_y, stride, row) : 0;
        }
        h[3] = npy ? qk__hash(0xcbf29ce484222325ull, desc->out_path, strlen(desc->out_path)) : 0;
        for (k = 0; k < 4; k++) sig[7 + k] = (int64_t)(h[k] >> 1);   /* non-negative, 63 bits */
    }
    MPI_Allreduce(sig, lo, 11, MPI_INT64_T, MPI_MIN, m.comm);
    MPI_Allreduce(sig, hi, 11, MPI_INT64_T, MPI_MAX, m.comm);
    for (k = 0; k < 11; k++)
        if (lo[k] != hi[k]) {
            rc = qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: the ranks disagree on %s (every rank passes the same %s and desc%s)", fn,
                          sig_names[sm != NULL][k], sm ? "states" : "map, X, Y", k == 4 ? "; set out_dtype when the ranks run different engines" : "");
            goto done;
        }

    /* 3. the rows of this rank */
    memset(&sd, 0, sizeof sd);
    sd.n_x = desc->n_x;
    sd.n_y = desc->y ? desc->n_y : 0;
    sd.n_workers = m.size;
    r = qk_schedule_make(&sd, &sch);
    rc = qk__mpi_decide(&m, r);
    if (rc != QK_OK) goto done;
    b.m = &m;
    b.ctx = ctx;
    b.map = map;
    b.sm = sm;
    b.desc = desc;
    b.es = b.dt == QK_F32 ? 4 : 8;
    b.n = desc->n_x;
    b.cols = desc->y ? desc->n_y : desc->n_x;
    b.symmetric = desc->y == NULL;
    b.path = npy ? desc->out_path : NULL;

    /* 4. NPY: the sink (rank 0 creates the temporary file; every rank opens it on its own handle) */
    if (npy) {
        rc = qk__mpi_sink_open(&m, &b, &snk);
        if (rc != QK_OK) goto done;
    }

    /* 5. compute and write this rank's band */
    b.caller = qk__thread_self();
    (void)qk__mutex_init(&b.mpi_lock);
    r = qk__mpi_run_band(&b, sch.row0[m.rank], sch.row0[m.rank + 1]);
    qk__mutex_destroy(&b.mpi_lock);
    if (r != QK_OK) qk__mpi_announce(&m, r);
    /* this rank failed (a cancel, an error): the job fails, so the temporary file goes now, not
       after the collective below, which never ends where another rank was killed (mpirun then
       terminates this process too: SIGTERM, the caller's progress callback cancels, and here) */
    if (r != QK_OK && snk.tmp) qk__tmp_discard(snk.tmp);
    rc = qk__mpi_decide(&m, r);
    /* a provider: the rows several ranks (or blocks) were given are the same everywhere, before
       the file is committed (the same result on every rank) */
    if (rc == QK_OK && provider) rc = qk__mpi_rows_agree(m.comm, &rows);

    /* 6. NPY: sync, close, check that every byte came, rename on rank 0 */
    if (npy) rc = qk__mpi_sink_close(&m, &b, &snk, rc);
done:
    if (snk.opened) MPI_File_close(&snk.fh);
    if (rc != QK_OK && snk.tmp && m.rank == 0) qk__tmp_discard(snk.tmp);
    QK_FREE(snk.tmp);
    QK_FREE(rows.h);
    QK_FREE(rows.tmp);
    if (sm) {
        sm->rows_fn = NULL;
        sm->rows_user = NULL;
    }
    qk_schedule_free(&sch);
    if (m.comm != MPI_COMM_NULL) MPI_Comm_free(&m.comm);
    QK_FREE(m.reqs);
    return rc;
}

QKDEF qk_result qk_gram_mpi(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, MPI_Comm comm)
{
    return qk__gram_mpi(ctx, map, desc, comm, "qk_gram_mpi", QK_OK, NULL, NULL);
}

#if defined(QK_CUDA) && QK_CUDA
/* Device states: a checksum of each side's rows (their elements, not the padding) on this rank's
   device, which the ranks compare as they compare host rows; the states are not copied. */
static qk_result qk__mpi_device_hash(qk_ctx *ctx, const qk__smap *sm, uint64_t h[2])
{
    const int64_t row_bytes = (int64_t)qk__state_row_bytes(&sm->op);
    char err[256] = "";
    qk_result r = qk_cuda_set_device(ctx->n_dev > 0 ? ctx->dev_ord[0] : 0, err, sizeof err);
    h[0] = h[1] = 0;
    if (r == QK_OK) r = qk_cuda_state_hash(sm->in.a, sm->in.n_a, sm->map.n_features, row_bytes, &h[0], err, sizeof err);
    if (r == QK_OK && sm->in.b) r = qk_cuda_state_hash(sm->in.b, sm->in.n_b, sm->map.n_features, row_bytes, &h[1], err, sizeof err);
    return r == QK_OK ? QK_OK : qk__fail(r, "%s: the device states' checksum: %s", sm->fn, err);
}
#endif

/* Given states: their map (qk__smap_make, as qk_gram_states makes it), run as a map's Gram is.
   Host rows are read in place or packed, and checked on every rank in the first phase; a
   provider's rows are asked for block by block (the tags of qk__smap point at each sub-job's
   rows) and checked as they come; device rows are read in place by each rank's GPU engine,
   checked on the device (qk__smap_make) and compared across ranks by a checksum computed there. */
QKDEF qk_result qk_gram_mpi_states(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, MPI_Comm comm)
{
    qk__smap sm;
    qk_gram_desc g;
    qk_result r;
    uint64_t dh[2] = {0, 0};
    int dev = 0;
    memset(&sm, 0, sizeof sm);
    memset(&g, 0, sizeof g);
    r = qk__smap_make(ctx, states, desc, "qk_gram_mpi_states", &sm, &g);
#if defined(QK_CUDA) && QK_CUDA
    if (r == QK_OK && sm.in.on_device) {
        /* a rank's blocks run on its context's GPUs as one process's job does: the first reads
           the states in place, the others copy their rows from it (qk__map_for_device) */
        dev = 1;
        r = qk__mpi_device_hash(ctx, &sm, dh);
    }
#endif
    r = qk__gram_mpi(ctx, &sm.map, &g, comm, "qk_gram_mpi_states", r, &sm, dev ? dh : NULL);
    qk__smap_free(&sm);
    return r;
}
#endif /* QK_MPI */
/* ---- end work schedule and MPI ---- */

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
