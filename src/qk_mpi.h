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

