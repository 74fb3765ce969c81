/* qk_cuda.cu — the CUDA engine of qk: state construction, fused Gram kernels, the pipeline.

   Design
   ------
   A feature map (qk_map) is compiled on the host into a small device program:

     GATE  a 2x2 matrix on one qubit (H, X, Y, RX, RY, basis-X); the matrix of every GATE is
           evaluated once per sample by a prep kernel (in double, then rounded to the precision)
     CNOT  a permutation on two qubits
     DIAG  a run of diagonal ops (Z, RZ, P, CZ, RZZ, and CNOT(c,t) P(t) CNOT(c,t) which is the
           diagonal e^{i theta (b_c xor b_t)}) folded into one quadratic phase form
              phase(b) = c0 + sum_i c_i b_i + sum_{i<j} d_ij b_i b_j
           whose coefficients the prep kernel sums per sample in double and reduces mod 2 pi
           (so the float32 phase sum stays small: its ulp, not the angles, sets the error).
           A zz layer of q(q-1)/2 CNOT-P-CNOT triples is thus one pass over the amplitudes.

   States are built in shared memory: a pass loads 2^L amplitudes of a state (the amplitudes
   whose indices vary over L chosen qubits, the others fixed per block), applies every op of
   the program that touches only those qubits, and stores once. For q <= L (L = 13: 64 KB of
   complex64 or 128 KB of complex128, inside Hopper's 227 KB opt-in) the whole circuit is one
   pass that starts from |0> in shared memory: one global write per state. Larger states (up to
   30 qubits) take several passes; the scheduler packs ops greedily into passes and always keeps
   the low qubits in the set so that global accesses stay coalesced. Small states (2^q < 512)
   share a block, so a 4-qubit state does not leave a block of 8 threads alone on an SM.

   Gram: K[i][j] = |<a_i|b_j>|^2 (real maps: <a_i|b_j>^2 over real amplitudes). Two engines:
     fused   a register-tiled SIMT kernel: <a|b> accumulated in registers, |.|^2 and the store
             in its epilogue; tiles staged through shared memory so that both the tile and its
             mirror (symmetric K) are written with coalesced rows. No complex matrix in memory.
             At 2..6 qubits (complex fp32, float K) its persistent tensor-core form (>>smalltc):
             the same epilogue, the inner products on mma.sync with fp16 hi/lo splits.
     blas    cuBLAS GEMM (C/Z/S/D) into a slab workspace, then a fused |.|^2 + mirror epilogue;
             for the tensor-core precision modes (TF32, FP32X3, FP16) real-form GEMMs of
             converted operands into Re and Im planes, the same epilogue (qk__tc_products).
   The planner picks one by qubit count (see qk__plan_cuda in qk.h for the measured reason).
   Symmetric K(X,X) computes only tiles with j >= i and writes both halves: each entry of K is
   written exactly once (the mirror writes only j > i).

   Product maps (no entangling op) never build states: per sample and qubit a 2-vector, and
   K[i][j] = prod_k |<u_k(x_i)|u_k(y_j)>|^2 (the analytic kernel).

   Output: K is produced in slabs of rows. K to the caller's device buffer: slabs straight into
   it. K to the host: when all of K fits the device budget it is kept resident (symmetric slabs
   mirror into later rows, so slab s is complete once slabs 0..s have run); each slab is copied
   D2H on a second stream while the next slab computes: straight into the caller's buffer when
   it is pinned, else into double-buffered pinned staging that qk.h's delivery hands on (a
   parallel copy into a pageable buffer, square tiles to the callback, the .npy stream). One synchronization per slab on the host side, none on the
   compute stream. When device memory runs out, the job is retried with smaller slabs and state
   tiles before it fails.

   Errors: every CUDA call goes through QK_CK, which records the expression, file and line in
   the caller's err buffer and returns a qk_result; every kernel is launched by its named
   launcher (qk__launch_<kernel>, in the kernel's section), which checks the launch with
   QK_LAUNCH_CK("<kernel>"): the detail message names the kernel.

   Layout: one section per operation (llm.c's layout): its kernels, then their launchers (grid
   and shared-memory math, stream, launch check), then its host driver; the pipeline that
   strings them into a Gram job, then the extern "C" surface. Contents below. */

/* Contents (grep for the tag; generated from the sources' tags by src/amalgamate.py; [file] is
   the source in src/cuda/ to edit; each operation's kernels, launchers and launch checks are
   one section, as in llm.c)
   @contents
   Above the sections: includes, fault injection (tests), errors (QK_CK, QK_LAUNCH_CK). */
#include "prelude.cuh"
#include "base.cuh"
#include "common.cuh"
#include "compile.cuh"
#include "states.cuh"
#include "widen.cuh"
#include "product.cuh"
#include "gram.cuh"
#include "small.cuh"
#include "smalltc.cuh"
#include "blas.cuh"
#include "amp.cuh"
#include "wgmma.cuh"
#include "tcf.cuh"
#include "pipeline.cuh"
#include "api.cuh"
#include "tune.cuh"
#include "devices.cuh"
#include "mps.cuh"
#include "vjp.cuh"
#include "projected.cuh"
