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
   @contents

   License: MIT (end of file).
*/
