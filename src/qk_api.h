/* >>results ---- results ---- */
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

/* >>maps ---- feature maps ---- */
/* clang-format off: the kinds in groups, one comment a group */
typedef enum qk_op_kind {
    QK_OP_H = 1, QK_OP_X, QK_OP_Y, QK_OP_Z,
    QK_OP_RX, QK_OP_RY, QK_OP_RZ, QK_OP_P,     /* one qubit (q0), angle */
    QK_OP_CNOT, QK_OP_CZ,                       /* control q0, target q1 */
    QK_OP_RZZ,                                  /* exp(-i t/2 Z_q0 Z_q1) (PennyLane MultiRZ on 2 wires) */
    QK_OP_AMPLITUDE,                            /* state := x / ||x||, zero-padded (first op only) */
    QK_OP_BASIS,                                /* X on q0 when feature angle.x0 is 1 (must be 0 or 1) */
    QK_OP_KIND_COUNT_
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

