/* >>plan ---- device info, planner, VRAM estimator ---- */
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
} qk_device_info;

typedef enum qk_backend { QK_BACKEND_CPU = 1, QK_BACKEND_CUDA } qk_backend;

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
    int use_blas;               /* GPU: 1 cuBLAS (HERK/SYRK + GEMM) + fused |.|^2 epilogue instead of
                                   the fused kernel; 2 the same with CGEMM3M (complex fp32); the
                                   tensor-core engines (real form of the complex product, blocks
                                   of the upper triangle, GEMMs of cuBLAS): 3 TF32, 4 FP32X3 (hi/lo
                                   fp16 split), 5 FP16, 6 BF16 (measurement only: no precision
                                   selects it), 7 FP64 real form (DGEMM); the fused tensor-core
                                   kernel (mma.sync, |.|^2 and the mirror in its epilogue, the
                                   triangular tile grid): 8 TF32, 9 FP32X3, 10 FP16 */
    int kernel_cfg;             /* GPU fused kernel tile configuration: 0 the fixed table, 1..8
                                   64x64, 128x64, 64x128, 128x128 tiles, 64x64 with register
                                   stores, 64x64 with k-steps of 16, the persistent few-qubit
                                   kernel (complex fp32, q <= 5), its tensor-core form (fp16
                                   hi/lo splits at fp32 accuracy, complex fp32, 2 <= q <= 6)
                                   (qk_cuda_tune_gram); with use_blas 8..10: 1 128x128 (warps
                                   64x32), 2 64x64 (32x32), 3 128x128 (32x64) */
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
       each GPU plans its own parts when it runs). Device k computes rows [dev_row0[k],
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
} qk_plan;

/* Three of the planner's rules that the GPU engine applies while it runs, defined once here (the
   GPU engine reads them, tests/test_planner.c checks them; the engine decides nothing else):
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
/* The planner with an injected device (tests without a GPU; info->present == 0 plans the CPU). */
QKDEF qk_result qk_plan_for_device(const qk_device_info *info, double vram_fraction,
                                   const qk_map *map, const qk_gram_desc *desc, qk_plan *out);
/* The planner for a list of n devices (infos[k] is CUDA ordinal ordinals[k]; NULL ordinals:
   0 .. n-1), as qk_plan_make plans a context of several GPUs: the whole job planned for infos[0],
   then, when every device gets at least QK_MGPU_MIN_PAIRS pairs, its rows dealt to as many of
   the devices (fewer when the job is smaller: n_devices = 1 below 2 QK_MGPU_MIN_PAIRS pairs).
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

/* Reads .npy version 1-3, dtype <f4/<f8 (and >f4/>f8, <i4/<i8), C order, 1-D or 2-D. */
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

/* >>tune ---- autotune cache (public) ---- */
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

/* >>schedule ---- work schedule: K dealt to workers (MPI ranks x GPUs) ---- */
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
   1.006 for n = 10^6 on 64 workers (tests/test_mpi_schedule.c checks <= 1.05). */
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

