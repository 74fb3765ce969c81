/* ======================================================================================== */
/* >>pipeline ---- the Gram job: streams and events, job state, qk__pipe's steps ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "compile.cuh"
#include "states.cuh"
#include "product.cuh"
#include "smalltc.cuh"
#include "blas.cuh"
#include "amp.cuh"
#include "tcf.cuh"

/* Stream pool: a compute and a copy stream; events around each operation give the per-stream
   busy intervals (summed after the final synchronization). */
enum qk__ev_tag { QK__EV_STATES, QK__EV_SLAB, QK__EV_COPY };
static double qk__host_ms(void)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct qk__pool {
    cudaStream_t st[2] = {nullptr, nullptr};
    cudaEvent_t t0 = nullptr;
    std::vector<cudaEvent_t> ev;   /* pairs (begin, end) */
    std::vector<int> ev_stream;
    std::vector<qk__ev_tag> ev_tag;
    std::vector<cudaEvent_t> ev_in;   /* the copy-in stream's (begin, end) pairs, kept apart: its
                                         intervals nest in the compute stream's slabs */
};

/* The stream pool a context keeps per GPU (qk_engine.h): st[0] compute, st[1] copy, st[2] the
   cuBLAS epilogue; the cuBLAS handle made on the first job that needs it. */
enum { QK__PB_SA, QK__PB_SB, QK__PB_PARAMS, QK__PB_TMP, QK__PB_CW0, QK__PB_CW1, QK__PB_KD, QK__PB_KT, QK__PB_X, QK__PB_Y, QK__PB_PROG, QK__PB_COUNT };
struct qk_cuda_pool {
    int device = -1;
    bool lent = false;
    cudaStream_t st[3] = {nullptr, nullptr, nullptr};
    cublasHandle_t blas = nullptr;
    void *buf[QK__PB_COUNT] = {};        /* the jobs' device buffers by role (states, build scratch, the
                                            cuBLAS workspace ring, K's slab ring or resident K, the
                                            features X and Y, the compiled program), kept across
                                            calls and grown when a job needs more */
    size_t bytes[QK__PB_COUNT] = {};
};

extern "C" size_t qk_cuda_pool_bytes(const qk_cuda_pool *p)
{
    size_t b = 0;
    if (p) for (int i = 0; i < QK__PB_COUNT; ++i) b += p->bytes[i];
    return b;
}

extern "C" void qk_cuda_pool_destroy(qk_cuda_pool *p)
{
    if (!p) return;
    int cur = -1;
    const bool back = cudaGetDevice(&cur) == cudaSuccess && cur != p->device && p->device >= 0;
    if (back) cudaSetDevice(p->device);
    for (int i = 0; i < 3; ++i)
        if (p->st[i]) { cudaStreamSynchronize(p->st[i]); cudaStreamDestroy(p->st[i]); }
    if (p->blas) cublasDestroy(p->blas);
    for (int i = 0; i < QK__PB_COUNT; ++i) cudaFree(p->buf[i]);
    if (back) cudaSetDevice(cur);
    cudaGetLastError();
    delete p;
}

extern "C" qk_result qk_cuda_pool_create(qk_cuda_pool **out, char *err, size_t err_size)
{
    qk__err e = {err, err_size};
    qk__err *E = &e;
    if (!out) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_pool_create: NULL argument");
    *out = nullptr;
    qk_cuda_pool *p = new (std::nothrow) qk_cuda_pool;
    if (!p) return qk__fail_msg(E, QK_ERROR_OUT_OF_MEMORY, "qk_cuda_pool_create: out of memory");
    auto make = [&]() -> qk_result {
        QK_CK(cudaGetDevice(&p->device));
        for (int i = 0; i < 3; ++i) QK_CK(cudaStreamCreateWithFlags(&p->st[i], cudaStreamNonBlocking));
        return QK_OK;
    };
    const qk_result r = make();
    if (r != QK_OK) { qk_cuda_pool_destroy(p); return r; }
    *out = p;
    return QK_OK;
}

/* A provider's rows (qk_cuda_io.fetch) cross in page-locked chunks of about this many bytes (at
   least one row), two of them, so that the provider fills one while the other is copied. */
#define QK__FETCH_BYTES ((size_t)32 << 20)

struct qk__job_state {
    qk__err *E;
    const qk_plan *plan;
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_rows_fn rows;                     /* host-side slabs (staged outputs) */
    void *rows_user;
    void *io_stage[2];                   /* the caller's pinned staging (may be NULL) */
    size_t io_stage_bytes;
    qk_cuda_stats *stats;
    const qk_cuda_prof_hooks *prof = nullptr; /* the profiler's GPU zones (qk_cuda_io.prof; NULL: none) */
    int64_t *delivered;                  /* slabs handed to rows (a retry after one would
                                            deliver rows twice) */
    qk__prog pg;
    qk__dprog dp;
    qk__pool pool;
    qk_cuda_pool *cpool = nullptr;       /* the GPU's stream pool offered (qk_cuda_io.pool) */
    qk_cuda_pool *lent = nullptr;        /* ... and borrowed for this job: its streams and handle */
    unsigned pooled = 0;                 /* the roles (QK__PB_*) whose buffer is the pool's */
    cublasHandle_t blas = nullptr;
    double *dx = nullptr, *dy = nullptr;
    bool x_in_place = false;             /* dx, dy are the caller's device states (qk_gram_states) */
    void *SA = nullptr, *SB = nullptr;   /* states (or qubit vectors) */
    qk__build_ws ws;
    void *Kd = nullptr;                  /* device K (resident) or slab ring */
    void *Cw[2] = {nullptr, nullptr};    /* cuBLAS workspace ring (slab s uses Cw[s & 1]) */
    cudaStream_t est = nullptr;          /* epilogue stream (cuBLAS path) */
    cudaEvent_t gemm_done = nullptr, ep_done[2] = {nullptr, nullptr};
    int64_t n_blas = 0;
    /* given host states streamed (qk__pipe::fetch): the copy-in stream, the raw rows' events,
       and the provider's pinned chunks (io->fetch) */
    qk_result (*fetch)(int side, int64_t r0, int64_t r1, double *dst, void *user) = nullptr;
    void *fetch_user = nullptr;
    cudaStream_t hs = nullptr;
    cudaEvent_t raw_ready = nullptr, raw_free = nullptr;
    bool raw_used = false;               /* raw_free recorded: the next copy-in waits for it */
    double *fb[2] = {nullptr, nullptr};  /* provider chunks of fb_rows rows (page-locked) */
    cudaEvent_t fb_done[2] = {nullptr, nullptr};
    int64_t fb_rows = 0, n_fb = 0;
    void *stage[2] = {nullptr, nullptr}; /* pinned staging */
    bool own_stage = false;              /* allocated for this job (else the caller's) */
    /* the transpose as well (qk_cuda_io.mirror_out / mrows): a slab's transpose on the device
       (Kt, made after the slab on its stream), and in the second half of each staging slot when staged */
    void *mirror_out = nullptr;
    int64_t mirror_ld = 0;
    int64_t band_rows = 0;               /* qk_cuda_io.band_rows: a symmetric job's first rows alone (0: all) */
    qk_rows_fn mrows = nullptr;
    void *mrows_user = nullptr;
    void *Kt = nullptr;
    void *mstage[2] = {nullptr, nullptr};
    cudaEvent_t kt_free = nullptr;       /* Kt's last transpose went down (the next one may overwrite it) */
    cudaEvent_t slab_done[2] = {nullptr, nullptr}, copy_done[2] = {nullptr, nullptr};
};

/* A pool's buffer of role r for one job: grown when too small (the pool's buffers not in this
   job's *pooled mask are given back first when the device is full); the role is then marked in
   *pooled (the job must not free it). Without a pool: the job's own cudaMalloc. */
static cudaError_t qk__pool_buf(qk_cuda_pool *P, unsigned *pooled, int r, void **out, size_t bytes)
{
    if (!P) return cudaMalloc(out, bytes);
    if (P->bytes[r] < bytes) {
        cudaFree(P->buf[r]);
        P->buf[r] = nullptr;
        P->bytes[r] = 0;
        cudaError_t e = cudaMalloc(&P->buf[r], bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            for (int i = 0; i < QK__PB_COUNT; ++i)
                if (i != r && !(*pooled & (1u << i)) && P->buf[i]) { cudaFree(P->buf[i]); P->buf[i] = nullptr; P->bytes[i] = 0; }
            e = cudaMalloc(&P->buf[r], bytes);
        }
        if (e != cudaSuccess) { P->buf[r] = nullptr; return e; }
        P->bytes[r] = bytes;
    }
    *out = P->buf[r];
    *pooled |= 1u << r;
    return cudaSuccess;
}

/* Borrows the pool offered to a job (qk_cuda_io.pool) when it is idle and belongs to the current
   GPU: its streams, handle and buffers serve the job until qk__pool_return. NULL: the job makes
   its own. */
static qk_cuda_pool *qk__pool_borrow(qk_cuda_pool *P)
{
    int dev = -1;
    if (!P || P->lent) return nullptr;
    if (cudaGetDevice(&dev) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    if (dev != P->device) return nullptr;
    P->lent = true;
    return P;
}
static void qk__pool_return(qk_cuda_pool *P)
{
    if (P) P->lent = false;
}

/* The job's device buffer of role r (qk__pool_buf on the pool it borrowed, if any). */
static cudaError_t qk__job_buf(qk__job_state *J, int r, void **out, size_t bytes)
{
    return qk__pool_buf(J->lent, &J->pooled, r, out, bytes);
}
#define QK__OWN(J, r) (!((J)->pooled & (1u << (r))))

static void qk__job_free(qk__job_state *J)
{
    if (J->hs) cudaStreamSynchronize(J->hs);
    if (J->pool.st[0]) cudaStreamSynchronize(J->pool.st[0]);
    if (J->pool.st[1]) cudaStreamSynchronize(J->pool.st[1]);
    qk__dprog_free(&J->dp);
    if (!J->x_in_place) {
        if (QK__OWN(J, QK__PB_X)) cudaFree(J->dx);
        if (QK__OWN(J, QK__PB_Y)) cudaFree(J->dy);
    }
    if (J->SA) QK__GZ_UNTRACK(J, J->SA);
    if (J->SB && J->SB != J->SA) QK__GZ_UNTRACK(J, J->SB);
    if (J->Kd && (J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out)) QK__GZ_UNTRACK(J, J->Kd);
    if (QK__OWN(J, QK__PB_SA)) cudaFree(J->SA);
    if (J->SB != J->SA && QK__OWN(J, QK__PB_SB)) cudaFree(J->SB);
    if (QK__OWN(J, QK__PB_PARAMS)) cudaFree(J->ws.params);
    if (QK__OWN(J, QK__PB_TMP)) cudaFree(J->ws.tmp);
    cudaFree(J->ws.inv);
    if ((J->desc->output != QK_OUTPUT_DEVICE || J->Kd != J->desc->out) && QK__OWN(J, QK__PB_KD)) cudaFree(J->Kd);
    if (J->est) cudaStreamSynchronize(J->est);
    if (QK__OWN(J, QK__PB_CW0)) cudaFree(J->Cw[0]);
    if (QK__OWN(J, QK__PB_CW1)) cudaFree(J->Cw[1]);
    if (QK__OWN(J, QK__PB_KT)) cudaFree(J->Kt);
    if (J->gemm_done) cudaEventDestroy(J->gemm_done);
    for (int i = 0; i < 2; ++i) if (J->ep_done[i]) cudaEventDestroy(J->ep_done[i]);
    if (J->est && !J->lent) cudaStreamDestroy(J->est);
    for (int i = 0; i < 2; ++i) {
        if (J->stage[i] && J->own_stage) cudaFreeHost(J->stage[i]);
        if (J->slab_done[i]) cudaEventDestroy(J->slab_done[i]);
        if (J->copy_done[i]) cudaEventDestroy(J->copy_done[i]);
        if (J->pool.st[i] && !J->lent) cudaStreamDestroy(J->pool.st[i]);
    }
    for (int i = 0; i < 2; ++i) {
        if (J->fb[i]) cudaFreeHost(J->fb[i]);
        if (J->fb_done[i]) cudaEventDestroy(J->fb_done[i]);
    }
    if (J->kt_free) cudaEventDestroy(J->kt_free);
    if (J->raw_ready) cudaEventDestroy(J->raw_ready);
    if (J->raw_free) cudaEventDestroy(J->raw_free);
    if (J->hs) cudaStreamDestroy(J->hs);
    for (auto e : J->pool.ev) cudaEventDestroy(e);
    for (auto e : J->pool.ev_in) cudaEventDestroy(e);
    if (J->pool.t0) cudaEventDestroy(J->pool.t0);
    if (J->blas && !J->lent) cublasDestroy(J->blas);
    qk__pool_return(J->lent);             /* handed back, its streams synchronised above */
    cudaGetLastError();
}

static qk_result qk__mark(qk__job_state *J, int s, qk__ev_tag tag)
{
    qk__err *E = J->E;
    cudaEvent_t e;
    QK_CK(cudaEventCreate(&e));
    J->pool.ev.push_back(e);
    J->pool.ev_stream.push_back(s);
    J->pool.ev_tag.push_back(tag);
    QK_CK(cudaEventRecord(e, J->pool.st[s]));
    return QK_OK;
}

/* The transpose of m x n entries (src, rows lds apart) into dst (n rows of m, ldd apart): 32 x 32
   tiles through shared memory (a padded row: no bank conflicts), coalesced reads and writes, a
   grid of at most `blocks` blocks striding over the tiles. A rectangle's mirror (qk_cuda_io.
   mirror_out / mrows): two passes over the slab in device memory, against one over PCIe. */
template <typename OutT>
__global__ void __launch_bounds__(256) qk__k_transpose(const OutT *__restrict__ src, int64_t lds, int64_t m, int64_t n, OutT *__restrict__ dst,
                                                       int64_t ldd)
{
    __shared__ OutT t[32][33];
    const int64_t tn = (n + 31) / 32, tiles = (m + 31) / 32 * tn;
    for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
        const int64_t r0 = b / tn * 32, c0 = b % tn * 32;
        for (int y = threadIdx.y; y < 32; y += 8) {
            const int64_t r = r0 + y, c = c0 + threadIdx.x;
            if (r < m && c < n) t[y][threadIdx.x] = src[r * lds + c];
        }
        __syncthreads();
        for (int y = threadIdx.y; y < 32; y += 8) {
            const int64_t c = c0 + y, r = r0 + threadIdx.x;
            if (r < m && c < n) dst[c * ldd + r] = t[threadIdx.x][y];
        }
        __syncthreads();
    }
}
template <typename OutT>
static qk_result qk__launch_transpose(const OutT *src, int64_t lds, int64_t m, int64_t n, OutT *dst, int64_t ldd, cudaStream_t st, qk__err *E)
{
    if (m <= 0 || n <= 0) return QK_OK;
    const int64_t tiles = (m + 31) / 32 * ((n + 31) / 32);
    qk__k_transpose<OutT><<<(unsigned)std::min<int64_t>(tiles, 4096), dim3(32, 8), 0, st>>>(src, lds, m, n, dst, ldd);
    QK_LAUNCH_CK("qk__k_transpose");
    return QK_OK;
}

/* One Gram job on the device, read top to bottom (qk__pipe::run):
     alloc     streams, the compiled program, X (and Y) on the device, state buffers and their
               build scratch, the cuBLAS handle and workspace ring
     output    where K's rows live on the device (the caller's buffer, K resident, or a ring of
               two slabs) and on the host (the caller's pinned buffer, or pinned staging)
     states    bulk state construction (else each slab builds its state tiles)
     slab      slab s of K on the compute stream (upper triangle + mirror where K is whole on
               the device, full rows in the slab ring)
     ship      its D2H on the copy stream (host outputs); with the transpose as well
               (qk_cuda_io.mirror_out / mrows) the slab's transpose, made where the slab
               finishes and copied down after it
     deliver   on the host: wait for a shipped slab, hand it to io->rows, report progress; slab
               s-1 is delivered while slab s computes and ships
     stats     per-stream busy time and phase times from the events
   Two leading dimensions only: ld_out, the caller's, and ldk, that of the device buffer the
   slab's rows are in. Every decision comes from the plan and the retry parameters (slab rows,
   state tile, K residency) that qk_cuda_gram passes; the steps derive nothing else. */
/* The pipeline's Gram call for the fused tensor-core engines (qk__pipe::gram). Operands live in
   J->Cw[0] (the pool's workspace role), allocated on first use: with all states resident (bulk) every state is converted
   once per job (J->n_blas marks it) and slabs index into them; with state tiles, the call's A
   and B rows are converted (once when they are the same rows). */
template <typename T, bool CPLX, typename OutT>
static qk_result qk__gram_tcf(qk__job_state *J, qk_gpu_engine eng, int cfg, bool bulk, int64_t tA, int64_t tB, const void *A, const void *B,
                              int64_t m, int64_t nn, int64_t D, OutT *o, int64_t ldo, OutT *mo, int64_t doff, int tri, cudaStream_t st,
                              int64_t mcols)
{
    qk__err *E = J->E;
    if (sizeof(T) != 4 || !qk__engine_tcf(eng))
        return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: the fused tensor-core engine takes float states (plan.engine TCF_*)");
    if (m <= 0 || nn <= 0) return QK_OK;
    const qk__tcf_geom G = qk__tcf_geometry(eng, D, CPLX);
    const size_t per_state = (size_t)G.W * sizeof(float);
    const bool shared_ab = bulk && J->SB == J->SA;
    const int64_t rows = bulk ? tA + (shared_ab ? 0 : tB) : tA + tB;
    if (!J->Cw[0]) QK_CK(qk__job_buf(J, QK__PB_CW0, &J->Cw[0], std::max<size_t>(16, (size_t)rows * G.ldw * 4)));
    uint32_t *ws = (uint32_t *)J->Cw[0];
    const uint32_t *opA, *opB;
    if (bulk) {
        if (J->n_blas == 0) {
            QK_TRY(qk__tcf_convert(G, J->SA, tA, ws, st, E));
            if (!shared_ab) QK_TRY(qk__tcf_convert(G, J->SB, tB, ws + tA * G.ldw, st, E));
            J->n_blas = 1;
        }
        const int64_t ia = (int64_t)(((const char *)A - (const char *)J->SA) / per_state);
        const int64_t ib = (int64_t)(((const char *)B - (const char *)J->SB) / per_state);
        opA = ws + ia * G.ldw;
        opB = ws + ((shared_ab ? 0 : tA) + ib) * G.ldw;
    } else {
        QK_TRY(qk__tcf_convert(G, A, m, ws, st, E));
        opA = ws;
        if (A == B) opB = ws;
        else {
            QK_TRY(qk__tcf_convert(G, B, nn, ws + tA * G.ldw, st, E));
            opB = ws + tA * G.ldw;
        }
    }
    return qk__launch_tcf<CPLX, OutT>(G, cfg, opA, opB, m, nn, o, ldo, mo, doff, tri, st, E, mcols);
}

template <typename T, bool CPLX, typename OutT> struct qk__pipe {
    qk__job_state *J;
    qk__err *E;
    const qk_plan *pl;
    const qk_gram_desc *ds;
    const qk_map *map;
    bool sym, analytic, use_blas, bulk, dev_out, pinned_out, mirror;
    bool tmirror;                        /* the transpose as well (J->mirror_out or J->mrows) */
    int linear;                          /* plan.linear: K = <a|b> itself (density matrices), not squared */
    qk_gpu_engine engine;                /* the plan's (qk__plan_engine) */
    int q, d;
    int64_t nx, ny, D, ld_out, slab_rows, state_tile, tA, tB, n_slabs, ldk;
    int64_t rows_out;                    /* rows of K this job delivers: nx, or a symmetric job's band (J->band_rows) */
    size_t es, per_state;
    size_t srow;                         /* bytes from one state's row to the next in SA / SB */
    size_t sslot;                        /* bytes a state takes in SA / SB (planes: its rows of the four planes) */
    int planes = 0;                      /* SA / SB hold Gauss's operand planes (qk__planes_out's mode) */
    int k_resident;
    cudaStream_t cs = nullptr, xs = nullptr;
    OutT *Kdev = nullptr;                /* the caller's device buffer or the resident K */
    int64_t done_pairs = 0;
    double deliver_ms = 0;
    bool stream_amp = false;             /* pure amplitude map, bulk states: the H2D encoder */
    bool streamed = false;               /* given host states copied in as needed (qk__pipe::upload) */
    bool peer = false;                   /* ... or device states of another GPU (QK__STATE_PEER) */
    double copyin = 0;                   /* bytes upload copied in */
    size_t rowu = 0;                     /* bytes of a host row the engine reads (span) */
    double enc_ms = 0;

    explicit qk__pipe(qk__job_state *job) : J(job), E(job->E), pl(job->plan), ds(job->desc), map(job->map)
    {
        /* the job as the plan describes it (qk_cuda_gram checked it against the desc) */
        sym = pl->symmetric != 0;
        nx = pl->n_x;
        ny = pl->n_y;
        const int64_t slab = pl->tile_m > 0 ? pl->tile_m : 1024;
        q = map->n_qubits;
        d = map->n_features;
        analytic = pl->path == QK_PATH_ANALYTIC;
        D = analytic ? 0 : ((int64_t)1 << q);
        es = CPLX ? 2 * sizeof(T) : sizeof(T);
        per_state = analytic ? (size_t)q * 4 * sizeof(T) : (size_t)D * es;
        srow = sslot = per_state;
        engine = qk__plan_engine(pl);
        use_blas = qk__engine_blas(engine) && !analytic;
        linear = pl->linear ? 1 : 0;
        ld_out = ds->ld_out > 0 ? ds->ld_out : ny;
        state_tile = pl->bulk_states || pl->state_tile <= 0 ? INT64_MAX : pl->state_tile;
        bulk = state_tile >= std::max(nx, ny); /* a tile of every sample is all of them */
        slab_rows = bulk ? slab : std::min(slab, state_tile); /* a slab's states are one tile */
        tA = bulk ? nx : state_tile;
        tB = bulk ? ny : state_tile;
        rows_out = sym && J->band_rows > 0 ? J->band_rows : nx;
        n_slabs = (rows_out + slab_rows - 1) / slab_rows;
        k_resident = pl->k_resident;
        dev_out = pl->output == QK_OUTPUT_DEVICE;
        /* given states read dim (a matrix: dim^2) elements of each row: a caller's ld may pad
           rows, and the array may end where its last row's elements do */
        rowu = (size_t)d * sizeof(double);
        if (qk__map_is_states(map)) rowu = std::min(rowu, qk__state_row_bytes(&map->ops[0]));
        pinned_out = pl->output == QK_OUTPUT_HOST && pl->host_pinned;
        mirror = qk__plan_mirror(pl) != 0;
        tmirror = !dev_out && (J->mirror_out || J->mrows);
        ldk = dev_out ? ld_out : ny;
        /* the planner's rule (qk.h): a pure amplitude map's states come from the streaming
           encoder (qk_cuda_amplitude_encode, at the PCIe bound) */
        stream_amp = !CPLX && qk__plan_stream_amp(pl, map);
        /* given host states (the data are the states, not a map's few features): copied in by
           state tile, never all of them at once unless the plan holds them all (bulk); a
           provider's rows (J->fetch) always through upload */
        streamed = J->fetch || (qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && !bulk);
        /* another GPU's device states (QK__STATE_PEER): copied in by upload, bulk or tiles */
        peer = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_PEER);
        streamed = streamed || peer;
    }

    qk_result alloc()
    {
        if ((J->lent = qk__pool_borrow(J->cpool))) {   /* the context's streams, kept across calls */
            J->pool.st[0] = J->lent->st[0];
            J->pool.st[1] = J->lent->st[1];
        } else {
            for (int i = 0; i < 2; ++i) QK_CK(cudaStreamCreateWithFlags(&J->pool.st[i], cudaStreamNonBlocking));
        }
        QK_CK(cudaEventCreate(&J->pool.t0));
        cs = J->pool.st[0];
        xs = J->pool.st[1];
        QK__GZ_STREAM_NAME(J, cs, "qk compute");
        QK__GZ_STREAM_NAME(J, xs, "qk copy");
        QK_CK(cudaEventRecord(J->pool.t0, cs));
        QK_TRY(qk__compile(map, &J->pg, E));
        if (J->pg.P > qk__cuda_params(map)) /* the planner counted the states' scratch with this budget */
            return qk__fail_msg(E, QK_ERROR_UNSUPPORTED, "qk_cuda_gram: internal error: the compiled program needs more "
                                                         "parameters than qk__cuda_params budgets (please report the map)");
        {   /* the program: one copy on the compute stream, into the pool's buffer when there is one */
            void *pb = nullptr;
            if (J->lent) QK_CK(qk__job_buf(J, QK__PB_PROG, &pb, qk__dprog_bytes(J->pg, map)));
            QK_TRY(qk__dprog_make(J->pg, map, &J->dp, E, pb, cs));
        }
        if (qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_DEVICE)) {
            /* the caller's device states, read in place: never copied, never freed here */
            J->x_in_place = true;
            J->dx = (double *)ds->x;
            J->dy = sym ? nullptr : (double *)ds->y;
        } else if (streamed) {
            /* bulk: every row on the device, filled by states(); tiles: one tile of raw rows,
               refilled on the copy-in stream while the previous tile's Gram runs */
            QK_CK(cudaStreamCreateWithFlags(&J->hs, cudaStreamNonBlocking));
            QK__GZ_STREAM_NAME(J, J->hs, "qk copy-in");
            QK_CK(cudaEventCreateWithFlags(&J->raw_ready, cudaEventDisableTiming));
            QK_CK(cudaEventCreateWithFlags(&J->raw_free, cudaEventDisableTiming));
            if (peer) qk__peer_access(ds->x);
            QK_CK(qk__job_buf(J, QK__PB_X, (void **)&J->dx, std::max<size_t>(1, (size_t)(bulk ? nx : tA) * d * sizeof(double))));
            if (bulk && !sym) QK_CK(qk__job_buf(J, QK__PB_Y, (void **)&J->dy, std::max<size_t>(1, (size_t)ny * d * sizeof(double))));
            if (J->fetch) {
                J->fb_rows = std::max<int64_t>(1, std::min<int64_t>((int64_t)(QK__FETCH_BYTES / ((size_t)d * sizeof(double))), std::max(nx, ny)));
                for (int i = 0; i < 2; ++i) {
                    QK_CK(cudaMallocHost((void **)&J->fb[i], (size_t)J->fb_rows * d * sizeof(double)));
                    QK_CK(cudaEventCreateWithFlags(&J->fb_done[i], cudaEventDisableTiming));
                }
            }
        } else if (!stream_amp) {
            QK_CK(qk__job_buf(J, QK__PB_X, (void **)&J->dx, std::max<size_t>(1, (size_t)nx * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dx, ds->x, span(nx), cudaMemcpyHostToDevice, cs));
            QK__TEST_ROWS_IN(span(nx));
        }
        if (!sym && !stream_amp && !J->x_in_place && !streamed) {
            QK_CK(qk__job_buf(J, QK__PB_Y, (void **)&J->dy, std::max<size_t>(1, (size_t)ny * d * sizeof(double))));
            QK_CK(cudaMemcpyAsync(J->dy, ds->y, span(ny), cudaMemcpyHostToDevice, cs));
            QK__TEST_ROWS_IN(span(ny));
        }
        /* The fp16, bf16 and fp32x3 engines in Gauss's form on bulk states that a map's program
           builds (not given states): the state builder writes the operand planes itself (re, im,
           re - im, re + im), so no Gram call runs the operand pass (QK_TC_PLANES=0, measurement:
           they do). fp16 and bf16 planes take the bytes of the complex fp32 states; fp32x3's,
           rows [hi lo hi hi] of 4D values, four times those, taken only where the workspace's
           operand room it saves is at least as large (the memory the planner counted bounds the
           job's still). Decided once here: the Gram calls and the workspace follow it. */
        if (CPLX && sizeof(T) == 4 && bulk && use_blas && !analytic && !stream_amp && !streamed &&
            (engine == QK_GPU_TC_FP16 || engine == QK_GPU_TC_BF16 || engine == QK_GPU_TC_FP32X3) && qk__tc_gauss(engine, true)) {
            const char *pe = getenv("QK_TC_PLANES");
            const size_t row = (size_t)D * 2 * (engine == QK_GPU_TC_FP32X3 ? 4 : 1), extra = 4 * row - per_state;
            const size_t slots = n_slabs > 1 ? 2 : 1;
            const size_t saved = slots * (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, false) -
                                          qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, true));
            if (!(pe && pe[0] == '0') && extra * (size_t)(tA + (sym ? 0 : tB)) <= saved && !J->pg.states) {
                planes = engine == QK_GPU_TC_FP16 ? 1 : engine == QK_GPU_TC_BF16 ? 2 : 3;
                srow = row;
                sslot = 4 * row;
            }
        }
        QK_CK(qk__job_buf(J, QK__PB_SA, &J->SA, std::max<size_t>(1, (size_t)tA * sslot)));
        QK__GZ_TRACK(J, "qk states", J->SA, (size_t)tA * sslot);
        if (sym && bulk) J->SB = J->SA;
        else {
            QK_CK(qk__job_buf(J, QK__PB_SB, &J->SB, std::max<size_t>(1, (size_t)tB * sslot)));
            QK__GZ_TRACK(J, "qk states", J->SB, (size_t)tB * sslot);
        }
        if (!analytic && !stream_amp) {
            int64_t tmax = std::max(tA, tB);
            QK_CK(qk__job_buf(J, QK__PB_PARAMS, &J->ws.params, (size_t)tmax * J->pg.P * sizeof(T)));
            if (J->pg.passes.size() > 1) QK_CK(qk__job_buf(J, QK__PB_TMP, &J->ws.tmp, (size_t)tmax * D * 2 * sizeof(T)));
            if (J->pg.has_amp) QK_CK(cudaMalloc((void **)&J->ws.inv, (size_t)tmax * sizeof(double)));
        }
        if (use_blas) {
            if (J->lent) {               /* the pool's handle, made by the first job that needs one */
                if (!J->lent->blas) QK_BLAS_CK(cublasCreate(&J->lent->blas));
                J->blas = J->lent->blas;
            } else {
                QK_BLAS_CK(cublasCreate(&J->blas));
            }
            QK_CK(qk__job_buf(J, QK__PB_CW0, &J->Cw[0], (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, planes != 0))));
            if (n_slabs > 1)
                QK_CK(qk__job_buf(J, QK__PB_CW1, &J->Cw[1], (qk__blas_ws_bytes<T, CPLX>(engine, slab_rows, tB, D, planes != 0))));
            /* the epilogue stream: the epilogue of one slab under the next slab's GEMMs (two
               workspace slots), and on the tensor-core engines a diagonal block's epilogue per
               block of rows under the next block's GEMMs (qk__launch_blas), one slab too */
            if (n_slabs > 1 || qk__engine_tc(engine)) {
                if (J->lent) J->est = J->lent->st[2];
                else QK_CK(cudaStreamCreateWithFlags(&J->est, cudaStreamNonBlocking));
                QK__GZ_STREAM_NAME(J, J->est, "qk epilogue");
                QK_CK(cudaEventCreateWithFlags(&J->gemm_done, cudaEventDisableTiming));
                for (int i = 0; i < 2; ++i) QK_CK(cudaEventCreateWithFlags(&J->ep_done[i], cudaEventDisableTiming));
            }
        }
        return QK_OK;
    }

    /* Pageable buffers are not page-locked for the job: registering fresh memory faults in every
       page on one thread, slower than the copy-out it saves; qk.h's delivery copies on all cores. */
    qk_result output()
    {
        if (!dev_out && !pinned_out && !J->rows)
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: staged output without a rows callback");
        if (dev_out) Kdev = (OutT *)ds->out;
        else if (k_resident) {
            QK_CK(qk__job_buf(J, QK__PB_KD, &J->Kd, (size_t)rows_out * ny * sizeof(OutT)));
            QK__GZ_TRACK(J, "qk K (resident)", J->Kd, (size_t)rows_out * ny * sizeof(OutT));
            Kdev = (OutT *)J->Kd;
        } else {
            QK_CK(qk__job_buf(J, QK__PB_KD, &J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT)));
            QK__GZ_TRACK(J, "qk K slab ring", J->Kd, (size_t)2 * slab_rows * ny * sizeof(OutT));
        }
        if (tmirror) {
            QK_CK(qk__job_buf(J, QK__PB_KT, &J->Kt, (size_t)slab_rows * ny * sizeof(OutT)));
            QK_CK(cudaEventCreateWithFlags(&J->kt_free, cudaEventDisableTiming));
        }
        if (!dev_out && !pinned_out) {
            /* a slab per slot, and its transpose after it when staged */
            const size_t sb = (size_t)slab_rows * ny * sizeof(OutT), slot = tmirror ? 2 * sb : sb;
            if (J->io_stage[0] && J->io_stage[1] && J->io_stage_bytes >= slot) {
                J->stage[0] = J->io_stage[0];
                J->stage[1] = J->io_stage[1];
            } else {
                J->own_stage = true;
                for (int i = 0; i < 2; ++i) QK_CK(cudaMallocHost(&J->stage[i], slot));
            }
            if (tmirror)
                for (int i = 0; i < 2; ++i) J->mstage[i] = (char *)J->stage[i] + sb;
        }
        for (int i = 0; i < 2; ++i) {
            QK_CK(cudaEventCreateWithFlags(&J->slab_done[i], cudaEventDisableTiming));
            QK_CK(cudaEventCreateWithFlags(&J->copy_done[i], cudaEventDisableTiming));
        }
        return QK_OK;
    }

    /* states (or per-qubit vectors) of rows [r0, r0 + cnt) of src into dst; with planes (bulk:
       every row of a side, r0 = 0) dst's cnt rows as operand planes */
    qk_result build(const double *src, int64_t r0, int64_t cnt, void *dst)
    {
        if (analytic) return qk__launch_qubit_vectors<T>(J->dp, q, src + r0 * d, cnt, d, (T *)dst, cs, E);
        /* the scale of qk__tc_gauss_products (2^floor(q/2), q = log2 D) */
        const qk__planes_out po = {planes, ldexpf(1.0f, q / 2), cnt * (int64_t)(srow / 2)};
        return qk__build_states<T>(J->pg, J->dp, src + r0 * d, cnt, J->ws, dst, !CPLX, cs, E, planes ? &po : nullptr);
    }

    /* an event on the copy-in stream (stats: its busy time) */
    qk_result mark_in()
    {
        cudaEvent_t e;
        QK_CK(cudaEventCreate(&e));
        J->pool.ev_in.push_back(e);
        QK_CK(cudaEventRecord(e, J->hs));
        return QK_OK;
    }

    /* the bytes of cnt consecutive host rows the engine reads: whole rows, then the last one's
       used part (never past the end of a caller's array whose ld pads its rows) */
    size_t span(int64_t cnt) const { return cnt > 0 ? (size_t)(cnt - 1) * (size_t)d * sizeof(double) + rowu : 0; }

    /* Given host states: rows [r0, r0 + cnt) of side (0: x, 1: y) into dev on the copy-in
       stream, from the caller's rows (page-locked by qk.h for the job where it could, so at the
       PCIe rate) or the provider's pinned chunks; the compute stream waits for them. The copy
       waits for the kernel that last read the raw rows (raw_free), so the next tile crosses PCIe
       while the current tile's Gram runs. */
    qk_result upload(int side, int64_t r0, int64_t cnt, double *dev)
    {
        const size_t rowb = (size_t)d * sizeof(double);
        if (J->raw_used) QK_CK(cudaStreamWaitEvent(J->hs, J->raw_free, 0));
        QK_TRY(mark_in());
        QK__GZ_GPU_BEGIN(J, "qk H2D states", J->hs);
        const double bytes = J->fetch ? (double)rowb * (double)cnt : (double)span(cnt);
        QK__GZ_COUNT(J, "qk H2D state bytes", bytes);
        copyin += bytes;
        if (!J->fetch) {
            const double *src = (side ? ds->y : ds->x) + r0 * d;
            QK_CK(cudaMemcpyAsync(dev, src, span(cnt), peer ? cudaMemcpyDefault : cudaMemcpyHostToDevice, J->hs));
            QK__TEST_ROWS_IN(span(cnt));
        } else {
            for (int64_t c = 0; c < cnt; c += J->fb_rows) {
                const int64_t k = std::min(J->fb_rows, cnt - c);
                const int b = (int)(J->n_fb & 1);
                if (J->n_fb >= 2) QK_CK(cudaEventSynchronize(J->fb_done[b])); /* its last chunk crossed */
                J->n_fb++;
                QK_TRY(J->fetch(side, r0 + c, r0 + c + k, J->fb[b], J->fetch_user));
                QK_CK(cudaMemcpyAsync(dev + c * d, J->fb[b], (size_t)k * rowb, cudaMemcpyHostToDevice, J->hs));
                QK__TEST_ROWS_IN((size_t)k * rowb);
                QK_CK(cudaEventRecord(J->fb_done[b], J->hs));
            }
        }
        QK__GZ_GPU_END(J, "qk H2D states", J->hs);
        QK_TRY(mark_in());
        QK_CK(cudaEventRecord(J->raw_ready, J->hs));
        QK_CK(cudaStreamWaitEvent(cs, J->raw_ready, 0));
        return QK_OK;
    }

    /* the states of rows [r0, r0 + cnt) of side into dst (a state tile) */
    qk_result tile(int side, int64_t r0, int64_t cnt, void *dst)
    {
        if (!streamed) return build(side ? J->dy : J->dx, r0, cnt, dst);
        QK_TRY(upload(side, r0, cnt, J->dx));
        QK_TRY(build(J->dx, 0, cnt, dst));
        QK_CK(cudaEventRecord(J->raw_free, cs));
        J->raw_used = true;
        return QK_OK;
    }

    /* K[A x B] (m x nn) into o (ld ldo), mirror into mo when given: of the first mcols columns
       only (a band of K(X,X)'s rows, qk_cuda_io.band_rows). The fused tensor-core engine takes
       mcols into its launch (its persistent wgmma kernels in one); the others run the columns
       from mcols on as a second call without a mirror. */
    qk_result gram(const void *A, const void *B, int64_t m, int64_t nn, OutT *o, int64_t ldo, OutT *mo, int64_t doff, int tri,
                   int64_t mcols = INT64_MAX)
    {
        if (m <= 0 || nn <= 0) return QK_OK;
        if (mo && mcols < nn && !(qk__engine_tcf(engine) && !analytic)) {
            const int64_t c = std::max<int64_t>(0, mcols);
            QK_TRY(gram(A, B, m, c, o, ldo, mo, doff, tri));
            return gram(A, (const char *)B + c * srow, m, nn - c, o + c, ldo, nullptr, doff + c, tri);
        }
        if (linear && (analytic || !use_blas))   /* qk_cuda_gram checks it first; the one epilogue with the flag */
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "qk_cuda_gram: plan.linear runs on the cuBLAS engines only");
        if (analytic) return qk__launch_product<T, OutT>((const T *)A, (const T *)B, m, nn, q, o, ldo, mo, doff, tri, cs, E);
        if (qk__engine_tcf(engine))
            return qk__gram_tcf<T, CPLX, OutT>(J, engine, pl->kernel_cfg, bulk, tA, tB, A, B, m, nn, D, o, ldo, mo, doff, tri, cs, mcols);
        if (!use_blas) return qk__launch_gram<T, CPLX, OutT>(pl->kernel_cfg, A, B, m, nn, (int)D, o, ldo, mo, doff, tri, cs, E);
        /* the workspace holds slab_rows x tB */
        const int64_t pv = (int64_t)(srow / 2);   /* values a plane's row */
        const qk__op_planes pp = {tA * pv, (sym ? tA : tB) * pv};
        for (int64_t c0 = 0; c0 < nn; c0 += tB) {
            int64_t cn = std::min(tB, nn - c0);
            const int two = J->Cw[1] != nullptr, k = two ? (int)(J->n_blas & 1) : 0;
            void *cw = J->Cw[k];
            if (J->est && J->n_blas >= (two ? 2 : 1)) QK_CK(cudaStreamWaitEvent(cs, J->ep_done[k], 0)); /* ring slot free */
            QK_TRY((qk__launch_blas<T, CPLX, OutT>(J->blas, engine, A, (const char *)B + c0 * srow, m, cn, (int)D, cw,
                                                    o + c0, ldo, mo ? mo + c0 * ldo : nullptr, doff + c0, tri, cs, E, J->est,
                                                    J->gemm_done, linear, planes ? &pp : nullptr)));
            if (J->est) QK_CK(cudaEventRecord(J->ep_done[k], J->est));
            J->n_blas++;
        }
        return QK_OK;
    }

    qk_result states()
    {
        if (!bulk) return QK_OK;
        if (stream_amp) { /* synchronous, on the job's streams: the compute stream's kernels come after it */
            double sec = 0, sec2 = 0;
            const qk_precision pr = sizeof(T) == 8 ? QK_PRECISION_FP64 : QK_PRECISION_FP32;
            QK_TRY(qk__amp_encode(ds->x, nx, d, q, pr, J->SA, 64, &sec, xs, cs, E));
            if (!sym) QK_TRY(qk__amp_encode(ds->y, ny, d, q, pr, J->SB, 64, &sec2, xs, cs, E));
            enc_ms = (sec + sec2) * 1e3;
            return QK_OK;
        }
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        QK__GZ_GPU_BEGIN(J, "qk states", cs);
        if (streamed) QK_TRY(upload(0, 0, nx, J->dx));
        QK_TRY(build(J->dx, 0, nx, J->SA));
        if (!sym && streamed) QK_TRY(upload(1, 0, ny, J->dy));
        if (!sym) QK_TRY(build(J->dy, 0, ny, J->SB));
        QK__GZ_GPU_END(J, "qk states", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_STATES));
        return QK_OK;
    }

    /* where row i0 of slab s lives on the device */
    OutT *rows_of(int64_t s)
    {
        const int64_t i0 = s * slab_rows;
        if (Kdev) return Kdev + i0 * ldk;
        return (OutT *)J->Kd + (s & 1) * slab_rows * ny;
    }

    qk_result slab(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        if (!Kdev && s >= 2) QK_CK(cudaStreamWaitEvent(cs, J->copy_done[s & 1], 0)); /* ring slot shipped */
        OutT *base = rows_of(s);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        QK__GZ_GPU_BEGIN(J, "qk gram slab", cs);
        QK__GZ_COUNT(J, "qk slabs", 1);
        const void *A;
        if (bulk) A = (const char *)J->SA + i0 * srow;
        else { QK_TRY(tile(0, i0, m, J->SA)); A = J->SA; }
        const int64_t jstart = mirror ? i0 : 0;
        /* the mirror stays in the rows this job delivers: a band's columns right of its end go
           without one (a rectangle, as a K(X,Y) job of those columns would compute it) */
        const int64_t cut = mirror ? std::min(ny, rows_out) : ny;
        if (bulk) {
            const void *B = (const char *)J->SB + jstart * srow;
            OutT *mo = mirror ? Kdev + jstart * ldk + i0 : nullptr;
            QK_TRY(gram(A, B, m, ny - jstart, base + jstart, ldk, mo, jstart - i0, mirror, cut - jstart));
        } else {
            for (int64_t j0 = jstart; j0 < ny; j0 += state_tile) {
                int64_t nn = std::min(state_tile, ny - j0);
                const void *B;
                if (sym && j0 == i0 && nn <= m) B = A; /* A holds only the slab's m rows */
                else { QK_TRY(tile(sym ? 0 : 1, j0, nn, J->SB)); B = J->SB; }
                QK_TRY(gram(A, B, m, nn, base + j0, ldk, mirror && j0 < cut ? Kdev + j0 * ldk + i0 : nullptr, j0 - i0, mirror && j0 == i0, cut - j0));
            }
        }
        if (J->est && s == n_slabs - 1) { /* the last epilogue ends the compute */
            QK_CK(cudaEventRecord(J->ep_done[0], J->est));
            QK_CK(cudaStreamWaitEvent(cs, J->ep_done[0], 0));
        }
        QK__GZ_GPU_END(J, "qk gram slab", cs);
        QK_TRY(qk__mark(J, 0, QK__EV_SLAB));
        return QK_OK;
    }

    qk_result ship(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        const int b = (int)(s & 1);
        const size_t rowb = (size_t)ny * sizeof(OutT);
        cudaStream_t ks = J->est ? J->est : cs;   /* the stream that finishes the slab's entries */
        if (tmirror) {   /* its transpose, there, once Kt's last one went down */
            if (s >= 1) QK_CK(cudaStreamWaitEvent(ks, J->kt_free, 0));
            QK_TRY(qk__launch_transpose<OutT>(rows_of(s), ldk, m, ny, (OutT *)J->Kt, m, ks, E));
        }
        QK_CK(cudaEventRecord(J->slab_done[b], ks));
        /* staging[b]'s previous slab (s-2) was delivered on the host before slab s was queued */
        QK_CK(cudaStreamWaitEvent(xs, J->slab_done[b], 0));
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK__GZ_GPU_BEGIN(J, "qk D2H slab", xs);
        QK__GZ_COUNT(J, "qk D2H bytes", (double)rowb * (double)m);
        if (pinned_out)
            QK_CK(cudaMemcpy2DAsync((OutT *)ds->out + i0 * ld_out, (size_t)ld_out * sizeof(OutT), rows_of(s),
                                    (size_t)ldk * sizeof(OutT), rowb, (size_t)m, cudaMemcpyDeviceToHost, xs));
        else
            QK_CK(cudaMemcpy2DAsync(J->stage[b], rowb, rows_of(s), (size_t)ldk * sizeof(OutT), rowb, (size_t)m,
                                    cudaMemcpyDeviceToHost, xs));
        if (tmirror) {   /* the slab's transpose (ny rows of m) into K's mirror or the slot's second half */
            QK__GZ_COUNT(J, "qk D2H bytes", (double)rowb * (double)m);
            if (J->mirror_out)
                QK_CK(cudaMemcpy2DAsync((OutT *)J->mirror_out + i0, (size_t)J->mirror_ld * sizeof(OutT), J->Kt, (size_t)m * sizeof(OutT),
                                        (size_t)m * sizeof(OutT), (size_t)ny, cudaMemcpyDeviceToHost, xs));
            else
                QK_CK(cudaMemcpyAsync(J->mstage[b], J->Kt, (size_t)m * rowb, cudaMemcpyDeviceToHost, xs));
            QK_CK(cudaEventRecord(J->kt_free, xs));
        }
        QK__GZ_GPU_END(J, "qk D2H slab", xs);
        QK_TRY(qk__mark(J, 1, QK__EV_COPY));
        QK_CK(cudaEventRecord(J->copy_done[b], xs));
        return QK_OK;
    }

    qk_result progress(int64_t m)
    {
        done_pairs += m * ny;
        if (ds->progress && ds->progress(done_pairs, rows_out * ny, ds->progress_user))
            return qk__fail_msg(E, QK_ERROR_CANCELLED, "progress callback cancelled the Gram");
        return QK_OK;
    }

    qk_result deliver(int64_t s)
    {
        const int64_t i0 = s * slab_rows, m = std::min(slab_rows, rows_out - i0);
        const int b = (int)(s & 1);
        QK_CK(cudaEventSynchronize(J->copy_done[b]));
        if (!pinned_out) {
            /* the callee sets qk's detail message; err stays empty */
            const double h0 = qk__host_ms();
            qk_result r = J->rows(i0, m, J->stage[b], ny, J->rows_user);
            if (r == QK_OK && J->mrows) r = J->mrows(i0, m, J->mstage[b], m, J->mrows_user);
            deliver_ms += qk__host_ms() - h0;
            ++*J->delivered;
            if (r != QK_OK) return r;
        }
        return progress(m);
    }

    qk_result stats()
    {
        qk_cuda_stats st;
        memset(&st, 0, sizeof st);
        st.n_streams = streamed ? 3 : 2;
        st.copyin_bytes = copyin;
        st.n_slabs = (int)n_slabs;
        int first_slab = -1, last_slab = -1, last_any = -1;
        float last_any_ms = -1;
        for (size_t i = 0; i + 1 < J->pool.ev.size(); i += 2) {
            float ms = 0, e1 = 0;
            QK_CK(cudaEventElapsedTime(&ms, J->pool.ev[i], J->pool.ev[i + 1]));
            st.busy_ms[J->pool.ev_stream[i]] += ms;
            if (J->pool.ev_tag[i] == QK__EV_STATES) st.states_ms += ms;
            if (J->pool.ev_tag[i] == QK__EV_SLAB) { if (first_slab < 0) first_slab = (int)i; last_slab = (int)i + 1; }
            QK_CK(cudaEventElapsedTime(&e1, J->pool.t0, J->pool.ev[i + 1]));
            if (e1 > last_any_ms) { last_any_ms = e1; last_any = (int)i + 1; }
        }
        st.wall_ms = last_any_ms;
        if (first_slab >= 0) {
            float g = 0, o = 0;
            QK_CK(cudaEventElapsedTime(&g, J->pool.ev[first_slab], J->pool.ev[last_slab]));
            QK_CK(cudaEventElapsedTime(&o, J->pool.ev[first_slab], J->pool.ev[last_any]));
            st.gram_ms = g;
            st.output_ms = std::max(g, o);
        }
        for (size_t i = 0; i + 1 < J->pool.ev_in.size(); i += 2) {
            float ms = 0;
            QK_CK(cudaEventElapsedTime(&ms, J->pool.ev_in[i], J->pool.ev_in[i + 1]));
            st.busy_ms[2] += ms;
        }
        st.deliver_ms = deliver_ms;
        st.states_ms += enc_ms;
        if (J->stats) *J->stats = st;
        return QK_OK;
    }

    qk_result run()
    {
        QK_TRY(alloc());
        QK_TRY(output());
        QK_TRY(states());
        for (int64_t s = 0; s < n_slabs; ++s) {
            QK_TRY(slab(s));
            if (dev_out) { QK_TRY(progress(std::min(slab_rows, rows_out - s * slab_rows))); continue; }
            QK_TRY(ship(s));
            if (s >= 1) QK_TRY(deliver(s - 1)); /* while slab s computes and ships */
        }
        if (!dev_out) QK_TRY(deliver(n_slabs - 1));
        if (J->est) QK_CK(cudaStreamSynchronize(J->est));
        QK_CK(cudaStreamSynchronize(cs));
        QK_CK(cudaStreamSynchronize(xs));
        return stats();
    }
};

