/* qk_gram_mpi_states with device states (issue 28) under mpirun -n 1 and 2
   (tests/mpi/states_gpu_mpi.py runs it): rank r's context on GPU r mod (GPUs), its device
   states on that GPU, every rank holding all the states (the same rows; the padding between
   rows differs by rank: it is not data).
   - K(A,A) and K(A,B), complex128 and float32 with padded rows, fp64: the .npy (rank 0) and the
     tiles (summed over the ranks: each entry once) equal qk_gram_states in one process on the
     same device states: bit for bit on one rank with blocks that hold the whole K (its one block
     is the one-process job), within 1e-12 otherwise (each block is its own qk_gram, whose GEMM
     may sum in another order), with large and with small blocks (64 KB: many blocks, rows read
     at offsets into the caller's arrays);
   - not copied: with blocks that hold a band (one slab: the diagonal block, and the rectangle
     right of it where the band ends before n; K(A,B): one block), the host states' run acquires
     on the device one x buffer per symmetric block and x and y per rectangle, which the device
     states' run does not; it acquires instead a norms buffer (the check) and a checksum buffer
     per side: the difference of the two runs' acquisitions (the QK_TEST_FAULTS counter) is
     exactly that;
   - a row that differs on one rank (2 ranks): every rank returns QK_ERROR_INVALID_ARGUMENT,
     "disagree on the states A" (the checksum computed on each device);
   - one rank with a context of two GPUs (where the machine has two): the rank's block runs on
     both, GPU 0 reading the states in place and GPU 1 copying its rows, K within 1e-12 of one
     GPU's.
   Exit 77 (skipped) when no CUDA device exists. */
#include <algorithm>
#include <vector>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include "qk.h"
#define QK_MPI
#define QK_IMPLEMENTATION
#include "qk.h"
static int rank_, size_;
static const char *rank_prefix(void)
{
    static char p[32];
    snprintf(p, sizeof p, "rank %d: ", rank_);
    return p;
}
#define QK_TEST_PREFIX() rank_prefix()
#include "../qk_test.h"

/* n normalised random states (the same on every rank: a fixed seed), rows ld elements apart,
   the padding filled with the rank's number */
static std::vector<char> rand_states(int64_t n, int64_t dim, int64_t ld, qk_state_type t, uint64_t seed)
{
    const bool cplx = t == QK_STATE_C128, f32 = t == QK_STATE_F32;
    const int es = cplx ? 16 : f32 ? 4 : 8;
    std::vector<char> s((size_t)(n * ld * es), (char)(1 + rank_));
    qk_test_seed_set(seed);
    for (int64_t i = 0; i < n; ++i) {
        std::vector<double> re((size_t)dim), im((size_t)dim);
        double ss = 0;
        for (int64_t k = 0; k < dim; ++k) {
            re[(size_t)k] = qk_test_urand() - 0.5;
            im[(size_t)k] = cplx ? qk_test_urand() - 0.5 : 0.0;
            if (f32) re[(size_t)k] = (float)re[(size_t)k];
            ss += re[(size_t)k] * re[(size_t)k] + im[(size_t)k] * im[(size_t)k];
        }
        for (int64_t k = 0; k < dim; ++k) {
            char *e = s.data() + (size_t)((i * ld + k) * es);
            double a = re[(size_t)k] / sqrt(ss), b = im[(size_t)k] / sqrt(ss);
            if (f32) { float v = (float)a; memcpy(e, &v, 4); }
            else if (cplx) { double v[2] = {a, b}; memcpy(e, v, 16); }
            else memcpy(e, &a, 8);
        }
    }
    return s;
}

struct Tiles { std::vector<double> *K; std::vector<int> *count; int64_t cols; bool sym; };
static int on_tile(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user)
{
    Tiles *T = (Tiles *)user;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b) {
            const int64_t i = i0 + a, j = j0 + b;
            if (T->sym && j < i) continue;   /* diagonal tiles come whole: their upper part counts */
            (*T->K)[(size_t)(i * T->cols + j)] += ((const double *)t)[a * ld + b];
            (*T->count)[(size_t)(i * T->cols + j)]++;
        }
    return 0;
}

static double max_diff(const std::vector<double> &a, const std::vector<double> &b)
{
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= m)) m = d;   /* NaN: infinity below */
        if (std::isnan(d)) return INFINITY;
    }
    return m;
}

/* a provider of the host rows a and b (row_bytes of each, ld_bytes apart; buf's rows are ld
   elements of esize bytes), counting A's rows asked for */
struct Prov { const char *a, *b; int64_t ld_bytes, row_bytes, esize, n_a, n_b; std::vector<int64_t> asked; };
static int give_rows(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user)
{
    Prov *p = (Prov *)user;
    if (i0 < 0 || i1 <= i0 || i1 > (side ? p->n_b : p->n_a)) return 1;
    for (int64_t i = i0; i < i1; ++i) {
        if (!side) p->asked[(size_t)i]++;
        memcpy((char *)buf + (size_t)((i - i0) * ld * p->esize), (side ? p->b : p->a) + (size_t)(i * p->ld_bytes), (size_t)p->row_bytes);
    }
    return 0;
}

struct Case { const char *what; qk_state_type t; int64_t dim, ld, na, nb; };

static void run_case(qk_ctx *gpu, int dev, const Case &c, const char *dir)
{
    const int es = c.t == QK_STATE_C128 ? 16 : c.t == QK_STATE_F32 ? 4 : 8;
    const int64_t cols = c.nb ? c.nb : c.na;
    std::vector<char> a = rand_states(c.na, c.dim, c.ld, c.t, 1001), b = c.nb ? rand_states(c.nb, c.dim, c.ld, c.t, 1002) : std::vector<char>();
    void *da = nullptr, *db = nullptr;
    cudaSetDevice(dev);
    if (cudaMalloc(&da, a.size()) != cudaSuccess || (c.nb && cudaMalloc(&db, b.size()) != cudaSuccess)) { CHECK(false, "cudaMalloc"); return; }
    cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
    if (c.nb) cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
    qk_states_desc sh, sd;
    memset(&sh, 0, sizeof sh);
    sh.type = c.t; sh.dim = c.dim; sh.a = a.data(); sh.n_a = c.na; sh.lda = c.ld;
    if (c.nb) { sh.b = b.data(); sh.n_b = c.nb; sh.ldb = c.ld; }
    sd = sh;
    sd.a = da; sd.b = db; sd.on_device = 1;

    /* one process, the same device states */
    std::vector<double> Kref((size_t)(c.na * cols), NAN);
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.out = Kref.data();
    qk_result r = qk_gram_states(gpu, &sd, &g);
    CHECK(r == QK_OK, "%s: qk_gram_states: %s", c.what, qk_last_error());

    const size_t blocks[2] = {(size_t)1 << 30, (size_t)64 << 10};
    for (size_t bb : blocks) {
        const bool whole = size_ == 1 && bb > (size_t)(c.na * cols * 8);
        const double tol = whole ? 0.0 : 1e-12;
        /* .npy */
        char path[1200];
        snprintf(path, sizeof path, "%s/states_gpu_mpi_K.npy", dir);
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_NPY; g.out_path = path; g.no_sync = 1;
        g.mpi_block_bytes = bb;
        r = qk_gram_mpi_states(gpu, &sd, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "%s, blocks %zu: qk_gram_mpi_states npy: %s", c.what, bb, qk_last_error());
        if (rank_ == 0 && r == QK_OK) {
            std::vector<double> K((size_t)(c.na * cols), NAN);
            bool ok = qk_test_read_k(path, c.na, cols, K.data());
            double e = ok ? max_diff(K, Kref) : INFINITY;
            CHECK(ok && e <= tol && (!whole || memcmp(K.data(), Kref.data(), K.size() * 8) == 0),
                  "%s, %d ranks, blocks %zu: the .npy differs from qk_gram_states' by %.3g (allowed %.3g%s)", c.what, size_, bb, e, tol,
                  whole ? ", bitwise" : "");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        /* tiles */
        std::vector<double> K((size_t)(c.na * cols), 0.0);
        std::vector<int> cnt((size_t)(c.na * cols), 0);
        Tiles T = {&K, &cnt, cols, c.nb == 0};
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T;
        g.mpi_block_bytes = bb;
        r = qk_gram_mpi_states(gpu, &sd, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "%s, blocks %zu: qk_gram_mpi_states callback: %s", c.what, bb, qk_last_error());
        MPI_Allreduce(MPI_IN_PLACE, K.data(), (int)K.size(), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, cnt.data(), (int)cnt.size(), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        int64_t bad = 0;
        double e = 0;
        for (int64_t i = 0; i < c.na; ++i)
            for (int64_t j = c.nb ? 0 : i; j < cols; ++j) {
                const size_t k = (size_t)(i * cols + j);
                double d = fabs(K[k] - Kref[k]);
                if (cnt[k] != 1 || !(d <= tol) || (whole && memcmp(&K[k], &Kref[k], 8) != 0)) bad++;
                if (d > e) e = d;
            }
        CHECK(bad == 0, "%s, %d ranks, blocks %zu: %lld tile entries missing, twice or off qk_gram_states' (max %.3g, allowed %.3g)",
              c.what, size_, bb, (long long)bad, e, tol);
    }

    /* not copied: the acquisitions of the host states' run less the device states' (blocks of
       1 GB: a band is one slab; the pools grown by a first run of each) */
    {
        qk_schedule_desc sdd;
        qk_schedule sch;
        memset(&sdd, 0, sizeof sdd);
        sdd.n_x = c.na; sdd.n_y = c.nb; sdd.n_workers = size_;
        CHECK(qk_schedule_make(&sdd, &sch) == QK_OK, "qk_schedule_make: %s", qk_last_error());
        const int64_t r0 = sch.row0[rank_], r1 = sch.row0[rank_ + 1];
        qk_schedule_free(&sch);
        const int sides = c.nb ? 2 : 1;
        const int copies = r1 <= r0 ? 0 : c.nb ? 2 : 1 + (r1 < c.na ? 2 : 0);
        std::vector<double> K((size_t)(c.na * cols), 0.0);
        std::vector<int> cnt((size_t)(c.na * cols), 0);
        Tiles T = {&K, &cnt, cols, c.nb == 0};
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T;
        g.mpi_block_bytes = (size_t)1 << 30;
        qk_gram_mpi_states(gpu, &sh, &g, MPI_COMM_WORLD);
        qk_gram_mpi_states(gpu, &sd, &g, MPI_COMM_WORLD);
        const int c0 = qk_cuda_test_alloc_count();
        qk_result rh = qk_gram_mpi_states(gpu, &sh, &g, MPI_COMM_WORLD);
        const int c1 = qk_cuda_test_alloc_count();
        qk_result rd = qk_gram_mpi_states(gpu, &sd, &g, MPI_COMM_WORLD);
        const int c2 = qk_cuda_test_alloc_count();
        CHECK(rh == QK_OK && rd == QK_OK, "%s: host / device states: %s", c.what, qk_last_error());
        CHECK((c1 - c0) - (c2 - c1) == copies - 2 * sides,
              "%s, band [%lld, %lld): device acquisitions: host states %d, device states %d (want host - device = %d copies of the "
              "states - %d norms and checksum buffers)", c.what, (long long)r0, (long long)r1, c1 - c0, c2 - c1, copies, 2 * sides);
    }

    /* the same states through a provider on each rank (the GPU engine fetches its blocks' rows
       into its page-locked chunks): K as the one-process provider run's, and no rank asked for
       a row of A before its band (K(A,A)) or outside it (K(A,B)) */
    {
        Prov pv = {a.data(), c.nb ? b.data() : nullptr, c.ld * es, c.dim * es, es, c.na, c.nb, std::vector<int64_t>((size_t)c.na, 0)};
        qk_states_desc sp = sh;
        sp.a = sp.b = nullptr; sp.lda = sp.ldb = 0;
        sp.provider = give_rows; sp.provider_user = &pv;
        std::vector<double> Kp((size_t)(c.na * cols), NAN), K((size_t)(c.na * cols), 0.0);
        std::vector<int> cnt((size_t)(c.na * cols), 0);
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.out = Kp.data();
        r = qk_gram_states(gpu, &sp, &g);
        CHECK(r == QK_OK && max_diff(Kp, Kref) <= 1e-12, "%s: qk_gram_states with a provider: %s (%.3g from the device states' K)", c.what,
              r == QK_OK ? "ok" : qk_last_error(), max_diff(Kp, Kref));
        std::fill(pv.asked.begin(), pv.asked.end(), 0);
        Tiles T = {&K, &cnt, cols, c.nb == 0};
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T;
        g.mpi_block_bytes = (size_t)64 << 10;
        r = qk_gram_mpi_states(gpu, &sp, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "%s: qk_gram_mpi_states with a provider: %s", c.what, qk_last_error());
        MPI_Allreduce(MPI_IN_PLACE, K.data(), (int)K.size(), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, cnt.data(), (int)cnt.size(), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        int64_t bad = 0, outside = 0;
        for (int64_t i = 0; i < c.na; ++i)
            for (int64_t j = c.nb ? 0 : i; j < cols; ++j) {
                const size_t k = (size_t)(i * cols + j);
                if (cnt[k] != 1 || !(fabs(K[k] - Kp[k]) <= 1e-12)) bad++;
            }
        qk_schedule_desc sdd;
        qk_schedule sch;
        memset(&sdd, 0, sizeof sdd);
        sdd.n_x = c.na; sdd.n_y = c.nb; sdd.n_workers = size_;
        if (qk_schedule_make(&sdd, &sch) == QK_OK) {
            for (int64_t i = 0; i < c.na; ++i)
                if (pv.asked[(size_t)i] && (i < sch.row0[rank_] || (c.nb && i >= sch.row0[rank_ + 1]))) outside++;
            qk_schedule_free(&sch);
        }
        CHECK(bad == 0 && outside == 0, "%s, %d ranks, a provider: %lld tile entries missing, twice or off the one-process K; %lld rows "
              "of A asked for outside the rank's blocks", c.what, size_, (long long)bad, (long long)outside);
    }

    /* a row that differs on one rank: every rank's error */
    if (size_ > 1) {
        std::vector<char> a2 = a;
        if (rank_ == size_ - 1) {
            if (c.t == QK_STATE_F32) { float v; memcpy(&v, a2.data() + (size_t)(7 * c.ld * es), 4); v = -v; memcpy(a2.data() + (size_t)(7 * c.ld * es), &v, 4); }
            else { double v; memcpy(&v, a2.data() + (size_t)(7 * c.ld * es), 8); v = -v; memcpy(a2.data() + (size_t)(7 * c.ld * es), &v, 8); }
        }
        cudaMemcpy(da, a2.data(), a2.size(), cudaMemcpyHostToDevice);
        std::vector<double> K((size_t)(c.na * cols), 0.0);
        std::vector<int> cnt((size_t)(c.na * cols), 0);
        Tiles T = {&K, &cnt, cols, c.nb == 0};
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_CALLBACK; g.tile_fn = on_tile; g.tile_user = &T;
        r = qk_gram_mpi_states(gpu, &sd, &g, MPI_COMM_WORLD);
        CHECK(r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "disagree on the states A"),
              "%s: a row that differs on rank %d: %s (%s)", c.what, size_ - 1, qk_result_string(r), qk_last_error());
        CHECK(std::count(cnt.begin(), cnt.end(), 0) == (std::ptrdiff_t)cnt.size(), "%s: tiles delivered though the ranks disagree", c.what);
    }
    cudaFree(da);
    if (db) cudaFree(db);
}

/* One rank with a context of GPUs 0 and 1, device states on GPU 0: the rank's block runs on both
   GPUs (GPU 1 copies its rows from GPU 0), K within 1e-12 of one process on one GPU. */
static void two_gpus(const char *dir)
{
    static const int ords[2] = {0, 1};
    const int64_t na = 700, nb = 260, dim = 512;
    qk_ctx_desc cd;
    qk_ctx *one = nullptr, *two = nullptr;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    cd.cuda_device = 0;
    cd.n_cuda_devices = 1;
    if (qk_ctx_create(&cd, &one) != QK_OK) { CHECK(false, "ctx: %s", qk_last_error()); return; }
    cd.cuda_devices = ords;
    cd.n_cuda_devices = 2;
    if (qk_ctx_create(&cd, &two) != QK_OK) { CHECK(false, "ctx: %s", qk_last_error()); qk_ctx_destroy(one); return; }
    std::vector<char> a = rand_states(na, dim, dim, QK_STATE_C128, 2001), b = rand_states(nb, dim, dim, QK_STATE_C128, 2002);
    void *da = nullptr, *db = nullptr;
    cudaSetDevice(0);
    if (cudaMalloc(&da, a.size()) != cudaSuccess || cudaMalloc(&db, b.size()) != cudaSuccess) { CHECK(false, "cudaMalloc"); return; }
    cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
    for (int sym = 1; sym >= 0; --sym) {
        const int64_t cols = sym ? na : nb;
        qk_states_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.type = QK_STATE_C128; sd.dim = dim; sd.a = da; sd.n_a = na; sd.on_device = 1;
        if (!sym) { sd.b = db; sd.n_b = nb; }
        std::vector<double> Kref((size_t)(na * cols), NAN), K((size_t)(na * cols), NAN);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.out = Kref.data();
        qk_result r = qk_gram_states(one, &sd, &g);
        CHECK(r == QK_OK, "two GPUs: one GPU's K: %s", qk_last_error());
        char path[1200];
        snprintf(path, sizeof path, "%s/states_gpu_mpi_two.npy", dir);
        memset(&g, 0, sizeof g);
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.output = QK_OUTPUT_NPY; g.out_path = path; g.no_sync = 1;
        g.mgpu_min_pairs = 1;
        g.mgpu_host_bound_split = 1;
        r = qk_gram_mpi_states(two, &sd, &g, MPI_COMM_WORLD);
        qk_cuda_stats st[2];
        memset(st, 0, sizeof st);
        const int nd = qk_ctx_device_stats(two, st, 2);
        bool ok = r == QK_OK && qk_test_read_k(path, na, cols, K.data());
        CHECK(ok && max_diff(K, Kref) <= 1e-12, "two GPUs in one rank %s: %s, |K - one GPU's| %.3g", sym ? "K(A,A)" : "K(A,B)",
              r == QK_OK ? "ran" : qk_last_error(), ok ? max_diff(K, Kref) : INFINITY);
        CHECK(nd == 2 && st[0].copyin_bytes == 0 && st[1].copyin_bytes > 0,
              "two GPUs in one rank %s: the rank's block ran on %d GPUs, copy-in %.3g / %.3g bytes (want 2 GPUs, GPU 0 reading in place, "
              "GPU 1 copying its rows)", sym ? "K(A,A)" : "K(A,B)", nd, (double)st[0].copyin_bytes, (double)st[1].copyin_bytes);
        remove(path);
    }
    cudaFree(da);
    cudaFree(db);
    qk_ctx_destroy(one);
    qk_ctx_destroy(two);
}

int main(int argc, char **argv)
{
    int n_dev = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        if (rank_ == 0) printf("no CUDA device: skipped\n");
        MPI_Finalize();
        return 77;
    }
    const char *dir = argc > 1 ? argv[1] : ".";
    const int dev = rank_ % n_dev;
    qk_ctx_desc cd;
    qk_ctx *gpu = nullptr;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.autotune = -1;
    cd.cuda_device = dev;
    cd.n_cuda_devices = 1;
    if (qk_ctx_create(&cd, &gpu) != QK_OK) {
        printf("rank %d: ctx: %s\n", rank_, qk_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const Case cases[] = {
        {"complex128 K(A,A), dim 256", QK_STATE_C128, 256, 256, 301, 0},
        {"complex128 K(A,B), dim 256", QK_STATE_C128, 256, 256, 211, 117},
        {"float32 K(A,A), dim 128, rows of 130 (padding differs by rank)", QK_STATE_F32, 128, 130, 257, 0},
    };
    for (const Case &c : cases) run_case(gpu, dev, c, dir);
    qk_ctx_destroy(gpu);
    if (size_ == 1 && n_dev >= 2) two_gpus(dir);
    else if (rank_ == 0) printf("two GPUs in one rank: %d ranks on %d GPUs: skipped\n", size_, n_dev);
    int total = 0, checks = 0;
    MPI_Allreduce(&qk_test_fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&qk_test_checks, &checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0) printf("test_states_gpu_mpi: %d ranks on %d GPUs: %d checks, %d failed\n", size_, n_dev < size_ ? n_dev : size_, checks, total);
    MPI_Finalize();
    return total ? 1 : 0;
}
