/* Several GPUs in one process (qk_ctx_desc.cuda_devices), against the CPU engine.

   On fresh random inputs (seed printed; QK_TEST_SEED replays), odd sizes, K(X,X) and K(X,Y),
   fp64 and fp32, every output mode (pageable and pinned HOST, DEVICE through out_devices, the
   tile callback, the streamed .npy file): K from 2 GPUs equals K from the CPU engine within
     fp64: 1e-12 (absolute; K is in [0, 1])
     fp32: 1e-4 (1 + q/4) + 2^-24 2^q / 4 + 1e-4 |ref| (test_gpu_engine.cpp's fp32 bound)
   Outputs are poisoned (NaN) first; every element of K is checked; the callback's tiles must
   cover the upper triangle exactly once. Two maps: zz on 5 qubits (K(X,X) to HOST / NPY as whole
   rows per GPU: qk_plan.dev_full_rows) and zz on 13 qubits in fp32 (each GPU's diagonal block +
   the rectangle right of it, whose transpose, the mirror, that GPU delivers: the other path),
   also in slabs of 16 rows.
   Every job's parts ran the plans the plan carries (plan.parts, planned and autotuned by
   qk_plan_make), which are those that planning each part on its GPU at run time gives
   (check_ran: byte for byte, the budget apart).
   Failures: a GPU's thread made to fail (qk__mgpu_test_fail), and every GPU allocation failing
   (qk_cuda_test_fail_alloc), and a cancel from the progress callback: the job fails with a
   message naming the device, and no .npy (nor temporary file) is left.
   Exit 77 (skipped) without a CUDA device, or with fewer than 2. */
#include <vector>
#include <string>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <unistd.h>
#include <cuda_runtime.h>
#define QK_MGPU_MIN_PAIRS 1   /* small K is dealt to both GPUs too */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "../qk_test.h"

struct TileRec { std::vector<double> *K; std::vector<int> *seen; int64_t cols; size_t es; bool sym; };
/* the progress callback's reports: calls, the last done and total, whether done ever went back */
struct ProgRec { int calls = 0; int64_t done = -1, total = -1; bool back = false; };
static int prog_cb(int64_t done, int64_t total, void *user)
{
    ProgRec *p = (ProgRec *)user;
    p->back = p->back || done < p->done;
    p->calls++;
    p->done = done;
    p->total = total;
    return 0;
}

static int tile_cb(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    TileRec *t = (TileRec *)user;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b) {
            double v = t->es == 4 ? ((const float *)tile)[a * ld + b] : ((const double *)tile)[a * ld + b];
            (*t->K)[(i0 + a) * t->cols + j0 + b] = v;
            (*t->seen)[(i0 + a) * t->cols + j0 + b]++;
            if (t->sym && i0 != j0) (*t->K)[(j0 + b) * t->cols + i0 + a] = v;   /* the caller mirrors */
        }
    return 0;
}

static double tol(qk_precision p, int q, double ref)
{
    if (p == QK_PRECISION_FP64) return 1e-12;
    return 1e-4 * (1 + q / 4.0) + std::ldexp(1.0, q - 24) / 4 + 1e-4 * std::fabs(ref);
}

static const char *out_name(int mode)
{
    static const char *n[6] = {"host", "host-pinned", "device", "callback", "npy", "?"};
    return n[mode < 5 ? mode : 5];
}

/* The plans the GPUs ran (qk__mgpu_test_ran: the engine records them under QK_TEST_FAULTS) are
   those the plan carries (plan.parts of qk_plan_make, made before the job), and those that
   planning each part on its GPU while the job runs gives (what the engine did before the plan
   carried them: the GPU's free memory with its stream pool's buffers, qk_plan_for_device, the
   autotune, the pinned test), byte for byte but for the budget (free memory read at another
   moment: the device output's buffers, the pool). */
static void check_ran(qk_ctx *gpu, const qk_map *map, const qk_gram_desc *g, const qk_plan *plan, const char *what)
{
    const int64_t ld = g->ld_out ? g->ld_out : plan->n_y;
    const size_t es = plan->out_dtype == QK_F64 ? 8 : 4;
    CHECK(plan->n_parts >= plan->n_devices - 1 && plan->n_parts > 0, "%s: %d parts", what, plan->n_parts);
    for (int i = 0; i < plan->n_parts; ++i) {
        const qk_plan_part *pp = &plan->parts[i];
        const int k = pp->device, ord = plan->devices[k];
        qk_plan ran, carried, ref;
        qk_gram_desc sd;
        qk_device_info info;
        char err[256];
        memcpy(&ran, &qk__mgpu_test_ran[i], sizeof ran);
        qk__plan_part_plan(plan, i, gpu->dev_info[k].name, &carried);
        memset(&sd, 0, sizeof sd);
        sd.x = g->x + pp->row0 * map->n_features;
        sd.n_x = pp->symmetric ? pp->n_cols : pp->n_rows;   /* a symmetric part: the job over X's rows of its columns (a band of them) */
        if (!pp->symmetric) { sd.y = (g->y ? g->y : g->x) + pp->col0 * map->n_features; sd.n_y = pp->n_cols; }
        sd.precision = plan->precision;
        sd.out_dtype = plan->out_dtype;
        sd.path = g->path;
        sd.output = g->output;
        if (qk_cuda_device_query(ord, &info, err, sizeof err) != QK_OK) { CHECK(0, "%s: query %d: %s", what, ord, err); continue; }
        info.free_bytes += qk_cuda_pool_bytes(gpu->spool[k]);
        if (qk_plan_for_device(&info, gpu->desc.vram_fraction, map, &sd, &ref) != QK_OK) { CHECK(0, "%s: part %d: %s", what, i, qk_last_error()); continue; }
        qk__plan_autotune(&info, gpu->desc.autotune < 0 ? -1 : 0, gpu->desc.cache_dir, nullptr, nullptr, &ref);
        if (g->output == QK_OUTPUT_HOST) ref.host_pinned = qk_cuda_host_pinned((const char *)g->out + (size_t)(pp->row0 * ld + pp->col0) * es);
        if (pp->mirror && (g->output == QK_OUTPUT_HOST || g->output == QK_OUTPUT_NPY)) qk_test_mirror_slab(&ref);
        CHECK(ran.backend == QK_BACKEND_CUDA && ran.n_x == sd.n_x && ran.n_y == pp->n_cols, "%s: part %d did not run", what, i);
        CHECK(ran.engine == pp->engine && ran.kernel_cfg == pp->kernel_cfg && ran.slab_rows == pp->slab_rows && strcmp(ran.config, pp->config) == 0,
              "%s: part %d ran engine %d cfg %d slabs %lld '%s', the plan says %d cfg %d slabs %lld '%s'", what, i, (int)ran.engine, ran.kernel_cfg,
              (long long)ran.slab_rows, ran.config, (int)pp->engine, pp->kernel_cfg, (long long)pp->slab_rows, pp->config);
        carried.bytes_budget = ref.bytes_budget = ran.bytes_budget;
        CHECK(memcmp(&ran, &carried, sizeof ran) == 0, "%s: part %d ran another plan than the plan carries", what, i);
        CHECK(memcmp(&ran, &ref, sizeof ran) == 0, "%s: part %d ran another plan than planning it on GPU %d now gives (engine %d cfg %d slabs %lld '%s')",
              what, i, ord, (int)ref.engine, ref.kernel_cfg, (long long)ref.slab_rows, ref.config);
    }
    cudaSetDevice(plan->devices[0]);
}

/* K from the GPU context through output mode (0 host, 1 pinned host, 2 device, 3 callback,
   4 npy), as doubles; returns the qk_gram result. */
static qk_result gpu_gram(qk_ctx *gpu, const qk_map *map, const std::vector<double> &x, int64_t nx, const std::vector<double> *y,
                          int64_t ny, qk_precision prec, int mode, const char *path, std::vector<double> &K, qk_plan *plan)
{
    const int64_t cols = y ? ny : nx;
    const qk_dtype od = prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32;
    const size_t es = od == QK_F64 ? 8 : 4, bytes = (size_t)(nx * cols) * es;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = nx;
    if (y) { g.y = y->data(); g.n_y = ny; }
    g.precision = prec;
    g.out_dtype = od;
    g.mgpu_host_bound_split = 1;   /* the whole-rows split is tested for every output (by default only a pinned HOST buffer) */
    K.assign((size_t)(nx * cols), NAN);
    std::vector<unsigned char> host;
    void *pinned = nullptr;
    std::vector<int> seen;
    TileRec tr{&K, &seen, cols, es, y == nullptr};
    void *dev[2] = {nullptr, nullptr};
    qk_result r;
    char err[256];
    if (mode == 0) { host.assign(bytes, 0xff); g.output = QK_OUTPUT_HOST; g.out = host.data(); }
    if (mode == 1) {
        if (qk_cuda_host_alloc(bytes, &pinned, err, sizeof err) != QK_OK) { printf("pinned: %s\n", err); return QK_ERROR_OUT_OF_MEMORY; }
        memset(pinned, 0xff, bytes);
        g.output = QK_OUTPUT_HOST; g.out = pinned;
    }
    if (mode == 3) { seen.assign((size_t)(nx * cols), 0); g.output = QK_OUTPUT_CALLBACK; g.tile_fn = tile_cb; g.tile_user = &tr; }
    if (mode == 4) { g.output = QK_OUTPUT_NPY; g.out_path = path; g.no_sync = 1; }
    if (mode == 2) g.output = QK_OUTPUT_DEVICE;
    r = qk_plan_make(gpu, map, &g, plan);
    if (r != QK_OK) return r;
    if (mode == 2) {
        for (int k = 0; k < plan->n_devices; ++k) {
            size_t rows = (size_t)(plan->dev_row0[k + 1] - plan->dev_row0[k]);
            cudaSetDevice(plan->devices[k]);
            if (cudaMalloc(&dev[k], std::max<size_t>(1, rows * cols * es)) != cudaSuccess) return QK_ERROR_DEVICE_OUT_OF_MEMORY;
            cudaMemset(dev[k], 0xff, rows * cols * es);   /* NaN */
        }
        g.out_devices = dev;
    }
    memset(qk__mgpu_test_ran, 0, sizeof qk__mgpu_test_ran);
    ProgRec pr;
    g.progress = prog_cb;
    g.progress_user = &pr;
    r = qk_gram(gpu, map, &g);
    if (r == QK_OK && plan->n_devices > 1) check_ran(gpu, map, &g, plan, out_name(mode));
    /* progress counts every entry of K once over the GPUs' parts (a band from the diagonal stands
       for its block and twice its rectangle, a mirrored rectangle twice) */
    if (r == QK_OK)
        CHECK(pr.calls > 0 && !pr.back && pr.total == nx * cols && pr.done == pr.total, "%s: progress %lld of %lld after %d calls%s",
              out_name(mode), (long long)pr.done, (long long)pr.total, pr.calls, pr.back ? ", went back" : "");
    if (r == QK_OK) {
        if (mode == 0 || mode == 1) {
            const unsigned char *p = mode == 0 ? host.data() : (const unsigned char *)pinned;
            for (int64_t i = 0; i < nx * cols; ++i) K[i] = es == 4 ? ((const float *)p)[i] : ((const double *)p)[i];
        }
        if (mode == 2) {
            for (int k = 0; k < plan->n_devices; ++k) {
                const int64_t a = plan->dev_row0[k], b = plan->dev_row0[k + 1];
                std::vector<unsigned char> h((size_t)((b - a) * cols) * es);
                cudaSetDevice(plan->devices[k]);
                cudaMemcpy(h.data(), dev[k], h.size(), cudaMemcpyDeviceToHost);
                for (int64_t i = a; i < b; ++i)
                    for (int64_t j = (y ? 0 : a); j < cols; ++j) {   /* K(X,X): columns from the band on */
                        const size_t o = (size_t)((i - a) * cols + j);
                        double v = es == 4 ? ((const float *)h.data())[o] : ((const double *)h.data())[o];
                        K[i * cols + j] = v;
                        if (!y) K[j * cols + i] = v;
                    }
            }
        }
        if (mode == 3) {
            int64_t bad = 0;
            for (int64_t i = 0; i < nx; ++i)
                for (int64_t j = (y ? 0 : i); j < cols; ++j) bad += seen[i * cols + j] != 1;
            CHECK(bad == 0, "callback: %lld upper-triangle elements delivered other than once", (long long)bad);
        }
        if (mode == 4) {
            qk_array a;
            if (qk_npy_read(path, &a) != QK_OK) { CHECK(0, "npy: cannot read back %s: %s", path, qk_last_error()); }
            else {
                CHECK(a.rows == nx && a.cols == cols, "npy: shape %lld x %lld", (long long)a.rows, (long long)a.cols);
                if (a.rows == nx && a.cols == cols) for (int64_t i = 0; i < nx * cols; ++i) K[i] = a.data[i];
                qk_array_free(&a);
            }
            remove(path);
        }
    }
    if (pinned) qk_cuda_host_free(pinned);
    for (int k = 0; k < 2; ++k) if (dev[k]) cudaFree(dev[k]);
    return r;
}

static std::vector<double> rand_x(int64_t n, int d)
{
    std::vector<double> x((size_t)(n * d));
    for (auto &v : x) v = qk_test_uniform(-1.0, 2.0);
    return x;
}

static void compare_case(qk_ctx *cpu, qk_ctx *gpu, const char *spec, int d, int64_t nx, int64_t ny, qk_precision prec, const char *dir)
{
    qk_map *map = nullptr;
    if (qk_map_parse(spec, d, &map) != QK_OK) { CHECK(0, "map %s: %s", spec, qk_last_error()); return; }
    std::vector<double> x = rand_x(nx, d), y = rand_x(ny > 0 ? ny : 1, d);
    const std::vector<double> *yp = ny > 0 ? &y : nullptr;
    const int64_t cols = ny > 0 ? ny : nx;
    std::vector<double> ref((size_t)(nx * cols), NAN);
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = nx;
    if (yp) { g.y = y.data(); g.n_y = ny; }
    g.out = ref.data(); g.out_dtype = QK_F64; g.precision = QK_PRECISION_FP64;
    if (qk_gram(cpu, map, &g) != QK_OK) { CHECK(0, "cpu: %s", qk_last_error()); qk_map_free(map); return; }
    std::string path = std::string(dir) + "/K_mgpu.npy";
    for (int mode = 0; mode < 5; ++mode) {
        std::vector<double> K;
        qk_plan plan;
        memset(&plan, 0, sizeof plan);
        qk_result r = gpu_gram(gpu, map, x, nx, yp, ny, prec, mode, path.c_str(), K, &plan);
        char what[160];
        snprintf(what, sizeof what, "%s K(%s) %lld x %lld %s %s", spec, yp ? "X,Y" : "X,X", (long long)nx, (long long)cols,
                 prec == QK_PRECISION_FP64 ? "fp64" : "fp32", out_name(mode));
        CHECK(r == QK_OK, "%s: %s", what, qk_last_error());
        if (r != QK_OK) continue;
        CHECK(plan.n_devices == 2, "%s: planned on %d devices", what, plan.n_devices);
        double worst = 0;
        int64_t bad = 0;
        for (int64_t i = 0; i < nx * cols; ++i) {
            double e = std::fabs(K[i] - ref[i]);
            if (!(e <= tol(prec, map->n_qubits, ref[i]))) { if (bad++ < 3) printf("  %s: K[%lld][%lld] = %.17g, cpu %.17g\n", what, (long long)(i / cols), (long long)(i % cols), K[i], ref[i]); }
            if (e > worst || e != e) worst = e;
        }
        double sec[2] = {0, 0};
        int nd = qk_ctx_device_seconds(gpu, sec, 2);
        CHECK(bad == 0, "%s: %lld elements off (worst %.3g)", what, (long long)bad, worst);
        CHECK(nd == 2, "%s: device seconds for %d GPUs", what, nd);
        printf("ok %-58s worst %.2e  %s  GPU %d %.3f s, GPU %d %.3f s\n", what, worst,
               plan.dev_full_rows ? "full rows" : "sym parts", plan.devices[0], sec[0], plan.devices[1], sec[1]);
    }
    CHECK(qk_test_count_files(dir, "K_mgpu") == 0, "%s: files left in %s", spec, dir);
    qk_map_free(map);
}

static int cancel_first(int64_t, int64_t, void *) { return 1; }

/* The default for a host-bound K(X,X) (mgpu_host_bound_split 0, QK_MGPU_HOST_BOUND_SPLIT 0): the
   first GPU alone into a pageable HOST buffer or a .npy file, whole rows on both GPUs into a
   page-locked HOST buffer (each GPU's own link, no host copy), and -1 keeps even that on one. */
static void host_bound_default(qk_ctx *gpu)
{
    qk_map *map = nullptr;
    if (qk_map_parse("zz(reps=2)", 5, &map) != QK_OK) { CHECK(0, "map: %s", qk_last_error()); return; }
    const int64_t n = 257;
    std::vector<double> x = rand_x(n, 5);
    std::vector<float> pageable((size_t)(n * n));
    void *pinned = nullptr;
    char err[256];
    if (qk_cuda_host_alloc((size_t)(n * n) * 4, &pinned, err, sizeof err) != QK_OK) { CHECK(0, "pinned: %s", err); qk_map_free(map); return; }
    qk_gram_desc g;
    qk_plan p;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = n; g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32; g.output = QK_OUTPUT_HOST;
    g.out = pageable.data();
    CHECK(qk_plan_make(gpu, map, &g, &p) == QK_OK && p.n_devices == 1, "host-bound K(X,X), pageable HOST: %d GPUs (want 1)", p.n_devices);
    g.output = QK_OUTPUT_NPY; g.out = nullptr; g.out_path = "/nonexistent/K.npy";
    CHECK(qk_plan_make(gpu, map, &g, &p) == QK_OK && p.n_devices == 1, "host-bound K(X,X), NPY: %d GPUs (want 1)", p.n_devices);
    g.output = QK_OUTPUT_HOST; g.out_path = nullptr; g.out = pinned;
    CHECK(qk_plan_make(gpu, map, &g, &p) == QK_OK && p.n_devices == 2 && p.dev_full_rows,
          "host-bound K(X,X), pinned HOST: %d GPUs, full rows %d (want 2, 1)", p.n_devices, p.dev_full_rows);
    memset(pinned, 0xff, (size_t)(n * n) * 4);
    CHECK(qk_gram(gpu, map, &g) == QK_OK, "pinned HOST on 2 GPUs: %s", qk_last_error());
    {   /* against the same job on the first GPU alone (-1), within 1e-5 (whole rows against the
           triangle: other products, fp32) */
        g.mgpu_host_bound_split = -1;
        g.out = pageable.data();
        CHECK(qk_plan_make(gpu, map, &g, &p) == QK_OK && p.n_devices == 1, "mgpu_host_bound_split -1, pageable: %d GPUs (want 1)", p.n_devices);
        CHECK(qk_gram(gpu, map, &g) == QK_OK, "pageable HOST on 1 GPU: %s", qk_last_error());
        int64_t bad = 0;
        for (int64_t i = 0; i < n * n; ++i) bad += !(std::fabs((double)((const float *)pinned)[i] - (double)pageable[i]) <= 1e-5);
        CHECK(bad == 0, "pinned HOST on 2 GPUs against 1 GPU: %lld entries differ by more than 1e-5", (long long)bad);
        g.out = pinned;
        CHECK(qk_plan_make(gpu, map, &g, &p) == QK_OK && p.n_devices == 1, "mgpu_host_bound_split -1, pinned: %d GPUs (want 1)", p.n_devices);
    }
    qk_cuda_host_free(pinned);
    qk_map_free(map);
}

static void failure_case(qk_ctx *gpu, const char *dir)
{
    qk_map *map = nullptr;
    if (qk_map_parse("zz(reps=2)", 6, &map) != QK_OK) { CHECK(0, "map"); return; }
    const int64_t n = 777;
    std::vector<double> x = rand_x(n, 6);
    std::string path = std::string(dir) + "/K_fail.npy";
    for (int kind = 0; kind < 4; ++kind) {
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n;
        g.output = QK_OUTPUT_NPY; g.out_path = path.c_str();
        g.mgpu_host_bound_split = 1;   /* on both GPUs (a .npy K(X,X) runs on the first alone by default) */
        const char *what = kind == 0 ? "GPU 1 fails" : kind == 1 ? "GPU 0 fails" : kind == 2 ? "every GPU allocation fails" : "progress cancels";
        if (kind == 0) qk__mgpu_test_fail = 1;
        if (kind == 1) qk__mgpu_test_fail = 0;
        if (kind == 2) qk_cuda_test_fail_alloc(-1);
        if (kind == 3) g.progress = cancel_first;
        qk_result r = qk_gram(gpu, map, &g);
        std::string msg = qk_last_error();
        qk__mgpu_test_fail = -1;
        qk_cuda_test_fail_alloc(0);
        CHECK(r != QK_OK, "%s: the job succeeded", what);
        if (kind == 0) CHECK(r == QK_ERROR_CUDA && msg.find("CUDA device 1") != std::string::npos, "%s: %s (%s)", what, qk_result_string(r), msg.c_str());
        if (kind == 1) CHECK(r == QK_ERROR_CUDA && msg.find("CUDA device 0") != std::string::npos, "%s: %s (%s)", what, qk_result_string(r), msg.c_str());
        if (kind == 2) CHECK((r == QK_ERROR_DEVICE_OUT_OF_MEMORY || r == QK_ERROR_CUDA) && msg.find("CUDA device") != std::string::npos, "%s: %s (%s)", what, qk_result_string(r), msg.c_str());
        if (kind == 3) CHECK(r == QK_ERROR_CANCELLED, "%s: %s (%s)", what, qk_result_string(r), msg.c_str());
        CHECK(access(path.c_str(), F_OK) != 0, "%s: %s exists", what, path.c_str());
        CHECK(qk_test_count_files(dir, "K_fail") == 0, "%s: a temporary file is left", what);
        printf("ok failure: %-28s -> %s: %s\n", what, qk_result_string(r), msg.c_str());
    }
    /* and the context still works afterwards */
    {
        std::vector<double> K((size_t)(n * n));
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n; g.out = K.data(); g.out_dtype = QK_F64;
        CHECK(qk_gram(gpu, map, &g) == QK_OK, "after the failures: %s", qk_last_error());
        /* output DEVICE without out_devices on 2 GPUs: a clear error */
        g.output = QK_OUTPUT_DEVICE;
        qk_result r = qk_gram(gpu, map, &g);   /* out is a host pointer, but out_devices is what is missing */
        CHECK(r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "out_devices"), "device output without out_devices: %s", qk_last_error());
    }
    qk_map_free(map);
}

int main(int argc, char **argv)
{
    int n = qk_cuda_device_count();
    if (n <= 0) { printf("no CUDA device: skipped\n"); return 77; }
    if (n < 2) { printf("%d CUDA device: this test needs 2 or more: skipped\n", n); return 77; }
    printf("%d GPUs\n", n);
    qk_test_seed();
    const char *dir = argc > 1 ? argv[1] : ".";
    qk_ctx *cpu = nullptr, *gpu = nullptr;
    qk_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    if (qk_ctx_create(&cd, &cpu) != QK_OK) { printf("cpu ctx: %s\n", qk_last_error()); return 1; }
    const int devs[2] = {0, 1};
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CUDA;
    cd.cuda_devices = devs;
    cd.n_cuda_devices = 2;
    if (qk_ctx_create(&cd, &gpu) != QK_OK) { printf("gpu ctx: %s\n", qk_last_error()); return 1; }
    CHECK(qk_ctx_query(gpu).n_cuda_devices == 2, "ctx resolved %d devices", qk_ctx_query(gpu).n_cuda_devices);
    {   /* the default context takes every visible GPU */
        qk_ctx *all = nullptr;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CUDA;
        CHECK(qk_ctx_create(&cd, &all) == QK_OK && qk_ctx_query(all).n_cuda_devices == std::min(n, QK_MAX_DEVICES),
              "default ctx: %d devices of %d", all ? qk_ctx_query(all).n_cuda_devices : -1, n);
        qk_ctx_destroy(all);
        cd.cuda_device = 1;   /* a non-zero cuda_device alone: that GPU only */
        CHECK(qk_ctx_create(&cd, &all) == QK_OK && qk_ctx_query(all).n_cuda_devices == 1 && qk_ctx_query(all).cuda_devices[0] == 1,
              "cuda_device = 1: not that device alone");
        qk_ctx_destroy(all);
    }
    const int64_t nx = 301 + (int64_t)(qk_test_rand64() % 50), ny = 157 + (int64_t)(qk_test_rand64() % 30);
    for (int prec = 0; prec < 2; ++prec) {
        qk_precision p = prec ? QK_PRECISION_FP32 : QK_PRECISION_FP64;
        compare_case(cpu, gpu, "zz(reps=2)", 5, nx, 0, p, dir);
        compare_case(cpu, gpu, "zz(reps=2)", 5, nx, ny, p, dir);
    }
    /* 13 qubits fp32: symmetric parts + host mirror for HOST and NPY too */
    compare_case(cpu, gpu, "zz(reps=1)", 13, 203, 0, QK_PRECISION_FP32, dir);
    compare_case(cpu, gpu, "zz(reps=1)", 13, 203, 97, QK_PRECISION_FP32, dir);
    /* ... in slabs of 16 rows (a test seam): the rectangles' transposes at every slab offset, and
       from the ring of slabs instead of a resident K; fp64 output too */
    qk__mgpu_test_slab = 16;
    compare_case(cpu, gpu, "zz(reps=1)", 13, 203, 0, QK_PRECISION_FP32, dir);
    compare_case(cpu, gpu, "zz(reps=1)", 14, 181, 0, QK_PRECISION_FP64, dir);   /* fp64 K: from 14 qubits (8-byte entries) */
    qk__mgpu_test_slab = 0;
    failure_case(gpu, dir);
    host_bound_default(gpu);
    qk_ctx_destroy(gpu);
    qk_ctx_destroy(cpu);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
