/* >>engine ---- what the planner and the GPU engine share ---- */
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
                        modes (use_blas 8, 10): their one set of accumulators runs all k-stages on
                        the tensor cores' truncating fp32 adds, an error that grows with 2^q (H200,
                        zz-linear: 0.0019 at 16 qubits, 0.0068 at 18, 0.021 at 20, past the fp32
                        state bound). FP32X3 flushes into round-to-nearest sums every
                        QK__TCF_FLUSH stages; flushing the others spills registers. */
#define QK__PASS_QUBITS 13
#define QK__N_FUSED_CFG 8
#define QK__TC_MAX_QUBITS 24
#define QK__TCF_NOFLUSH_MAX_QUBITS 16

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
        int diag = k == QK_OP_Z || k == QK_OP_RZ || k == QK_OP_P || k == QK_OP_CZ || k == QK_OP_RZZ;
        if (k == QK_OP_CNOT && i + 2 < m->n_ops) {
            const qk_op *a = &m->ops[i + 1], *b = &m->ops[i + 2];
            if ((a->kind == QK_OP_Z || a->kind == QK_OP_RZ || a->kind == QK_OP_P) && a->q0 == m->ops[i].q1 &&
                b->kind == QK_OP_CNOT && b->q0 == m->ops[i].q0 && b->q1 == m->ops[i].q1) {
                diag = 1;
                i += 2;
            }
        }
        if (k == QK_OP_AMPLITUDE) continue;
        if (diag) { if (!in_diag) runs++; in_diag = 1; continue; }
        in_diag = 0;
        if (k != QK_OP_CNOT) gates++;
    }
    return 8 * gates + runs * (1 + q + q * q) + 4 * q + 1;
}

/* The fixed table: the fused configuration for a q-qubit state without autotune: for complex
   fp32 states with float K, the persistent few-qubit kernel on the tensor cores from 2 to 6
   qubits (fp16 hi/lo splits at fp32 accuracy; 1.1x to 2.3x the SIMT persistent kernel on an
   H200, docs/benchmarks.md) and the SIMT one at 1 qubit; 64x64 t4x4 for the other small states
   (2^q <= 32: fewer registers, more blocks in flight) and for fp64 (accumulators twice the
   size), else 128x64 t8x4 (complex) or 128x128 t8x8 (real). */
static inline int qk__fused_cfg_fixed(int q, int f64, int cplx, int f32out)
{
    if (!f64 && cplx && f32out && q <= 6) return q >= 2 ? 8 : 7;
    return q <= 5 || f64 ? 1 : cplx ? 2 : 4;
}
/* The tile shape of fused configuration cfg (1..QK__N_FUSED_CFG), as plans name it. */
static inline const char *qk__fused_cfg_name(int cfg)
{
    switch (cfg) {
    case 1: return "64x64 t4x4";
    case 2: return "128x64 t8x4";
    case 3: return "64x128 t4x8";
    case 4: return "128x128 t8x8";
    case 5: return "64x64 t4x4 direct";
    case 6: return "64x64 k16 t4x4";
    case 7: return "persistent t8x4";
    case 8: return "persistent tc 3xfp16";
    default: return "?";
    }
}
/* The tensor-core engine (qk_plan.use_blas) of a precision: 3 TF32, 4 FP32X3, 5 FP16, FP64's real
   form 7 (fp64_real_form), else 0. */
static inline int qk__tc_engine(qk_precision p, int fp64_real_form)
{
    return p == QK_PRECISION_TF32 ? 3 : p == QK_PRECISION_FP32X3 ? 4 : p == QK_PRECISION_FP16 ? 5
         : p == QK_PRECISION_FP64 && fp64_real_form ? 7 : 0;
}
/* ---- end engine ---- */

