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

