/* qk-bench: the GPU engine's cases of issue 3, timed with CUDA events (warm-up, median).

   Usage: qk-bench [--json out.json] [--commit FILE] [--cases a,b,...] [--reps N]
   (cases also xy6, xy7, xy8: K(X,Y) of 32768 x 32768 on the device, fp32 / the default / fp16,
   --xy-modes a subset of fp32,default,fp16)
   Each case runs qk_cuda_gram end to end; the engine's own events split the time into state
   construction (stats.states_ms), the Gram (first slab start to last slab end: gram_ms) and
   the output (to the last D2H: output_ms). Gpairs/s counts all n*n entries of K (as the peer
   does), although K(X,X) computes half of them. bench/qk_bench_report.py joins this JSON with
   the peer's (run in the same job) and prints the table with ratios and ceilings. --cases roof:
   issue 26's table in one process, each row with its floor (the write of K or the GEMM rate of
   what the plan runs, both measured in the job) and its share (roof()). */
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <algorithm>
#include <thread>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#define QK_IMPLEMENTATION
#include "qk.h"

static qk_op mk(qk_op_kind k, int a, int b, qk_arg_kind ak, int x0, int x1, double scale, int w)
{
    qk_op o;
    memset(&o, 0, sizeof o);
    o.kind = k; o.q0 = a; o.q1 = b;
    o.angle.kind = ak; o.angle.x0 = x0; o.angle.x1 = x1; o.angle.scale = scale; o.angle.w = w;
    return o;
}

struct BMap {
    std::vector<qk_op> ops;
    std::vector<double> w;
    qk_map m;
    void finish(int q, int d, qk_map_class c) {
        memset(&m, 0, sizeof m);
        m.type = QK_MAP_CUSTOM; m.cls = c; m.n_qubits = q; m.n_features = d;
        m.n_ops = (int)ops.size(); m.ops = ops.data(); m.n_weights = (int)w.size(); m.weights = w.data();
    }
};

/* Qiskit ZZFeatureMap, full entanglement, alpha = 2 (the peer's zz) */
static void build_zz(BMap &b, int q, int reps)
{
    for (int r = 0; r < reps; ++r) {
        for (int i = 0; i < q; ++i) b.ops.push_back(mk(QK_OP_H, i, -1, QK_ARG_CONST, 0, 0, 1, 0));
        for (int i = 0; i < q; ++i) b.ops.push_back(mk(QK_OP_P, i, -1, QK_ARG_X, i, 0, 2, 0));
        for (int i = 0; i < q; ++i)
            for (int j = i + 1; j < q; ++j) {
                b.ops.push_back(mk(QK_OP_CNOT, i, j, QK_ARG_CONST, 0, 0, 1, 0));
                b.ops.push_back(mk(QK_OP_P, j, -1, QK_ARG_PIXX, i, j, 2, 0));
                b.ops.push_back(mk(QK_OP_CNOT, i, j, QK_ARG_CONST, 0, 0, 1, 0));
            }
    }
    b.finish(q, q, QK_CLASS_COMPLEX);
}
/* the peer's hea: per layer RY(w_lk x_k) on every qubit, then a CZ ring */
static void build_hea(BMap &b, int q, int layers, std::mt19937_64 &rng)
{
    std::uniform_real_distribution<double> u(0, 1);
    for (int l = 0; l < layers; ++l) {
        for (int k = 0; k < q; ++k) {
            b.ops.push_back(mk(QK_OP_RY, k, -1, QK_ARG_WX, k, 0, 1, (int)b.w.size()));
            b.w.push_back(u(rng));
        }
        for (int k = 0; k < q; ++k) b.ops.push_back(mk(QK_OP_CZ, k, (k + 1) % q, QK_ARG_CONST, 0, 0, 1, 0));
    }
    b.finish(q, q, QK_CLASS_REAL);
}

static qk_device_info g_info;

/* The planner's plan for the real device; blas < 0 keeps its engine choice, slab <= 0 its slab. */
static qk_plan plan_for(const qk_map &m, const qk_gram_desc &g, int blas, int64_t slab, int cfg)
{
    qk_plan p;
    if (qk_plan_for_device(&g_info, 0.85, &m, &g, &p) != QK_OK) { printf("plan: %s\n", qk_last_error()); exit(1); }
    if (blas >= 0) p.engine = (qk_gpu_engine)blas;
    if (slab > 0) p.tile_m = slab;
    if (blas >= 0 || cfg) p.kernel_cfg = cfg; /* a planned engine keeps the plan's configuration */
    return p;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

struct Row {
    std::string name, map, output, engine, precision;
    int q; int64_t n;
    double gram_ms, states_ms, output_ms, e2e_ms, busy0, busy1, deliver_ms;
    double max_err = -1, diag_err = -1; /* prec cases: vs an fp64 K (-1: not measured) */
    std::string roof;                   /* roof cases: the row's roofline fields, JSON (roof_row) */
};

static std::vector<Row> rows;
static std::vector<std::string> g_probe_rows;
static int reps = 3;
static qk_ctx *g_ctx = nullptr; /* keeps the pinned staging across calls, as a user's context does */
static qk_plan g_last_plan;      /* the plan run_case ran last (the roof cases read it) */

static const char *prec_name(qk_precision p)
{
    return p == QK_PRECISION_FP64 ? "fp64" : p == QK_PRECISION_TF32 ? "tf32" : p == QK_PRECISION_FP32X3 ? "fp32x3" : p == QK_PRECISION_FP16 ? "fp16" : "fp32";
}

/* keep (device output only): the K buffer is handed back instead of freed; y: K(X,Y) of n x n
   (every entry computed, none mirrored) instead of K(X,X) */
static int run_case(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n, qk_output out, int blas,
                    int64_t slab, bool pinned_host, bool e2e, int cfg = 0, bool fresh = false,
                    qk_precision prec = QK_PRECISION_FP32, void **keep = nullptr, const std::vector<double> *y = nullptr)
{
    void *buf = nullptr;
    const qk_dtype od = prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32;
    const size_t esz = od == QK_F64 ? 8 : 4;
    size_t bytes = (size_t)n * n * esz;
    if (out == QK_OUTPUT_DEVICE) { if (cudaMalloc(&buf, bytes) != cudaSuccess) { printf("%s: no memory\n", name); return 1; } }
    else if (pinned_host) { if (cudaMallocHost(&buf, bytes) != cudaSuccess) { printf("%s: no pinned memory\n", name); return 1; } }
    else { buf = malloc(bytes); if (!fresh) memset(buf, 0, bytes); }
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = n; g.out = buf; g.out_dtype = od; g.output = out; g.precision = prec;
    if (y) { g.y = y->data(); g.n_y = n; }
    qk_plan p = plan_for(m, g, blas, slab, cfg);
    p.host_pinned = out == QK_OUTPUT_HOST && pinned_host;
    g_last_plan = p;
    std::vector<double> gm, sm, om, em, b0, b1, dm;
    for (int r = 0; r < reps + 1; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        if (fresh) { free(buf); buf = malloc(bytes); g.out = buf; } /* untouched pages, as a new buffer */
        qk_result rc = qk__plan_run(g_ctx, &p, &m, &g, NULL);
        auto t1 = std::chrono::steady_clock::now();
        const qk_cuda_stats st = qk_ctx_cuda_stats(g_ctx);
        if (rc != QK_OK) { printf("%s: qk__plan_run -> %d: %s\n", name, (int)rc, qk_last_error()); return 1; }
        if (r == 0) continue; /* warm-up */
        gm.push_back(st.gram_ms); sm.push_back(st.states_ms); om.push_back(st.output_ms);
        em.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        b0.push_back(st.busy_ms[0]); b1.push_back(st.busy_ms[1]); dm.push_back(st.deliver_ms);
    }
    /* sanity: K[i][i] = 1 for a few i */
    double dmax = 0;
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 7)) {
        double v = 0;
        float f = 0;
        if (out == QK_OUTPUT_DEVICE) {
            if (esz == 8) cudaMemcpy(&v, (double *)buf + i * n + i, 8, cudaMemcpyDeviceToHost);
            else { cudaMemcpy(&f, (float *)buf + i * n + i, 4, cudaMemcpyDeviceToHost); v = f; }
        } else v = esz == 8 ? ((double *)buf)[i * n + i] : ((float *)buf)[i * n + i];
        dmax = std::max(dmax, fabs(v - 1.0));
    }
    Row row;
    row.name = name; row.q = m.n_qubits; row.n = n;
    row.map = m.cls == QK_CLASS_REAL ? "hea" : "zz";
    row.output = out == QK_OUTPUT_DEVICE ? "device" : pinned_host ? "host-pinned" : "host-pageable";
    row.engine = qk__engine_name(p.engine) ? qk__engine_name(p.engine) : "?";
    row.precision = prec_name(p.precision); /* what ran: the default / auto name their mode */
    if (blas < 0) row.engine += "(planned)";
    if (y) row.engine += " K(X,Y)";
    row.engine += " slab=" + std::to_string((long long)p.tile_m);
    if (cfg) row.engine += " cfg=" + std::to_string(cfg);
    if (out == QK_OUTPUT_HOST && !pinned_host && fresh) row.output += "-fresh";
    row.gram_ms = median(gm); row.states_ms = median(sm); row.output_ms = median(om); row.e2e_ms = median(em);
    row.busy0 = median(b0); row.busy1 = median(b1); row.deliver_ms = median(dm);
    rows.push_back(row);
    double pairs = (double)n * n;
    printf("%-6s q=%2d n=%6lld %-6s %-13s %-26s gram %9.3f ms %8.2f Gpairs/s | out %9.3f ms %7.2f Gpairs/s | states %8.3f ms %10.0f /s | e2e %8.2f ms (host delivery %.2f ms) | diag err %.1e\n",
           name, m.n_qubits, (long long)n, row.precision.c_str(), row.output.c_str(), row.engine.c_str(), row.gram_ms, pairs / row.gram_ms / 1e6,
           row.output_ms, pairs / row.output_ms / 1e6, row.states_ms, n / row.states_ms * 1e3, row.e2e_ms, row.deliver_ms, dmax);
    fflush(stdout);
    (void)e2e;
    if (keep && out == QK_OUTPUT_DEVICE) *keep = buf;
    else if (out == QK_OUTPUT_DEVICE) cudaFree(buf);
    else if (pinned_host) cudaFreeHost(buf);
    else free(buf);
    return 0;
}

/* ---- precision modes (issue 12, docs/precision.md) ----
   Per case, K(X,X) to the device in every mode (run_case: warm-up, median), each compared with
   an fp64 K of the same samples from the GPU engine (fp64 cuBLAS ZHERK/DSYRK, itself checked
   against the CPU engine by the GPU suite): max_err over 512 evenly spaced rows (all their
   columns), diag_err = max |K_ii - 1| over the whole diagonal. */
static void sample_rows(const void *K, int64_t n, size_t esz, int64_t R, std::vector<double> &rowv, std::vector<double> &diag)
{
    std::vector<unsigned char> tmp((size_t)n * esz);
    rowv.assign((size_t)R * n, 0);
    for (int64_t i = 0; i < R; ++i) {
        const int64_t r = i * n / R;
        cudaMemcpy(tmp.data(), (const char *)K + (size_t)r * n * esz, (size_t)n * esz, cudaMemcpyDeviceToHost);
        for (int64_t j = 0; j < n; ++j) rowv[(size_t)i * n + j] = esz == 8 ? ((double *)tmp.data())[j] : ((float *)tmp.data())[j];
    }
    std::vector<unsigned char> d((size_t)n * esz);
    cudaMemcpy2D(d.data(), esz, K, (size_t)(n + 1) * esz, esz, (size_t)n, cudaMemcpyDeviceToHost);
    diag.resize((size_t)n);
    for (int64_t i = 0; i < n; ++i) diag[(size_t)i] = esz == 8 ? ((double *)d.data())[i] : ((float *)d.data())[i];
}

/* K(X,X) in fp64 to the device, R of its rows and its diagonal sampled (sample_rows): the
   reference of the precision cases. false, with a line printed, where it cannot be computed. */
static bool fp64_reference(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n, int64_t R, std::vector<double> &rref,
                           std::vector<double> &dref)
{
    void *kref = nullptr;
    if (cudaMalloc(&kref, (size_t)n * n * 8) != cudaSuccess) { printf("%s: no memory for the fp64 reference\n", name); return false; }
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x.data(); g.n_x = n; g.out = kref; g.out_dtype = QK_F64; g.output = QK_OUTPUT_DEVICE; g.precision = QK_PRECISION_FP64;
    qk_plan p = plan_for(m, g, -1, 0, 0);
    if (qk__plan_run(g_ctx, &p, &m, &g, NULL) != QK_OK) { printf("%s: fp64 reference: %s\n", name, qk_last_error()); cudaFree(kref); return false; }
    sample_rows(kref, n, 8, R, rref, dref);
    cudaFree(kref);
    return true;
}

/* The sampled rows' largest |K - K_fp64| (*me) and the diagonal's largest |K_ii - 1| (*de);
   infinity where one is NaN */
static void sample_errors(const std::vector<double> &rv, const std::vector<double> &rref, const std::vector<double> &dv, double *me, double *de)
{
    *me = 0; *de = 0;
    for (size_t i = 0; i < rv.size(); ++i) { double e = fabs(rv[i] - rref[i]); if (!(e <= *me)) *me = std::isnan(e) ? INFINITY : e; }
    for (size_t i = 0; i < dv.size(); ++i) { double e = fabs(dv[i] - 1.0); if (!(e <= *de)) *de = std::isnan(e) ? INFINITY : e; }
}

static void prec_case(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n, bool f64)
{
    /* the fp64 reference */
    const int64_t R = std::min<int64_t>(n, 512);
    std::vector<double> rref, dref, rv, dv;
    if (!fp64_reference(name, m, x, n, R, rref, dref)) return;
    struct M { qk_precision p; int blas; } modes32[] = {
        {QK_PRECISION_FP32, -1}, {QK_PRECISION_FP32X3, -1}, {QK_PRECISION_TF32, -1}, {QK_PRECISION_FP16, -1}, {QK_PRECISION_FP16, 6}};
    struct M modes64[] = {{QK_PRECISION_FP64, -1}, {QK_PRECISION_FP64, 7}};
    const int nm = f64 ? 2 : 5;
    for (int k = 0; k < nm; ++k) {
        const M &md = f64 ? modes64[k] : modes32[k];
        /* below the planner's tensor-core threshold the plan takes the fp32 fused kernel: name
           the tensor-core engine to measure it there */
        static const int tcb[6] = {0, 0, 0, 3, 4, 5};
        const int blas = md.blas < 0 && m.n_qubits < 6 && md.p != QK_PRECISION_FP32 && md.p != QK_PRECISION_FP64 ? tcb[md.p] : md.blas;
        void *buf = nullptr;
        if (run_case(name, m, x, n, QK_OUTPUT_DEVICE, blas, 0, false, false, 0, false, md.p, &buf) != 0 || !buf) continue;
        sample_rows(buf, n, md.p == QK_PRECISION_FP64 ? 8 : 4, R, rv, dv);
        cudaFree(buf);
        double me, de;
        sample_errors(rv, rref, dv, &me, &de);
        Row &row = rows.back();
        if (md.blas == 6) row.precision = "bf16";
        row.max_err = me; row.diag_err = de;
        printf("   -> %s %s: max |K - K_fp64| %.3e (%lld sampled rows), max |K_ii - 1| %.3e\n", name, row.precision.c_str(), me, (long long)R, de);
        fflush(stdout);
    }
    /* K to pinned host memory (slabs: the columns' operands are converted once per slab) */
    if (!f64 && m.n_qubits == 8) {
        run_case(name, m, x, n, QK_OUTPUT_HOST, -1, 0, true, false, 0, false, QK_PRECISION_FP32);
        run_case(name, m, x, n, QK_OUTPUT_HOST, -1, 0, true, false, 0, false, QK_PRECISION_FP32X3);
        run_case(name, m, x, n, QK_OUTPUT_HOST, -1, 0, true, false, 0, false, QK_PRECISION_TF32);
    }
}

/* ---- the fused tensor-core kernel against the cuBLAS tensor-core engines (bench/run.sh prec) ----
   Per case, K(X,X) to the device: fp32 as planned, then fp32x3, tf32 and fp16 each on the cuBLAS
   engine (QK_GPU_TC_TF32 .. TC_FP16) and on the fused kernel (QK_GPU_TCF_*) in every configuration (cfg 0 = the
   fixed table's), each with its error against an fp64 K of the same samples (as prec_case). */
struct Mode { qk_precision p; int blas, cfg; };

/* Half a second with the GPU idle before a timed row that follows heavy work (the fp64 reference,
   an fp32x3 row): the software power cap (throttle reason 0x4) otherwise still holds the SM clock
   down (1905 against 1980 MHz on the H200; the row 4-14% slower: docs/benchmarks.md, 'fp32x3 from
   5 qubits'). */
static void settle()
{
    cudaDeviceSynchronize();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

/* K(X,X) to the device in each mode, each against an fp64 K of the same samples */
static void modes_case(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n, const std::vector<Mode> &modes)
{
    const int64_t R = std::min<int64_t>(n, 512);
    std::vector<double> rref, dref, rv, dv;
    if (!fp64_reference(name, m, x, n, R, rref, dref)) return;
    for (auto &md : modes) {
        void *buf = nullptr;
        settle();
        if (run_case(name, m, x, n, QK_OUTPUT_DEVICE, md.blas, 0, false, false, md.cfg, false, md.p, &buf) != 0 || !buf) continue;
        sample_rows(buf, n, 4, R, rv, dv);
        cudaFree(buf);
        double me, de;
        sample_errors(rv, rref, dv, &me, &de);
        Row &row = rows.back();
        row.max_err = me; row.diag_err = de;
        printf("   -> %s %s %s: max |K - K_fp64| %.3e (%lld sampled rows), max |K_ii - 1| %.3e (stated bound %.2e)\n", name,
               row.precision.c_str(), row.engine.c_str(), me, (long long)R, de, g_last_plan.error_bound);
        fflush(stdout);
    }
}

static void tc_case(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n)
{
    modes_case(name, m, x, n,
               {{QK_PRECISION_FP32, -1, 0},
                {QK_PRECISION_FP32X3, 4, 0}, {QK_PRECISION_FP32X3, 9, 2}, {QK_PRECISION_FP32X3, 9, 4},
                {QK_PRECISION_TF32, 3, 0}, {QK_PRECISION_TF32, 8, 1}, {QK_PRECISION_TF32, 8, 2},
                {QK_PRECISION_FP16, 5, 0}, {QK_PRECISION_FP16, 10, 1}, {QK_PRECISION_FP16, 10, 2}, {QK_PRECISION_FP16, 10, 4}});
}

/* cudaMemsetAsync of bytes on the device: the median ms of 5 after a warm-up (CUDA events); < 0
   where the memory is not there */
static double memset_ms(size_t bytes)
{
    void *buf = nullptr;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) { cudaGetLastError(); return -1; }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<double> ms;
    for (int r = 0; r < 6; ++r) {
        cudaEventRecord(e0);
        cudaMemsetAsync(buf, 0x3f, bytes);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (r) ms.push_back(t);
    }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    cudaFree(buf);
    return median(ms);
}

/* The write floor of an n x n float K in this job: cudaMemsetAsync of the n*n*4 bytes, median of
   5 after a warm-up (Gpairs/s = n*n / t; returned, 0 where it could not be measured). */
static double write_floor(int64_t n)
{
    const size_t bytes = (size_t)n * n * 4;
    const double t = memset_ms(bytes);
    if (t <= 0) { printf("write floor: no memory\n"); return 0; }
    printf("write floor n=%lld: cudaMemset of %.2f GB %.3f ms = %.0f GB/s = %.0f Gpairs/s\n", (long long)n, bytes / 1e9, t,
           bytes / (t * 1e6), (double)n * n / (t * 1e6));
    char line[160];
    snprintf(line, sizeof line, "{\"probe\": \"write floor (cudaMemset)\", \"n\": %lld, \"ms\": %.4f, \"Gpairs_s\": %.1f}", (long long)n, t,
             (double)n * n / (t * 1e6));
    g_probe_rows.push_back(line);
    return (double)n * n / (t * 1e6);
}

/* A and B of an N x N GEMM in type t (bytes each, at least N*N of t): finite values in (-1, 1)
   (never time on zeros or NaNs) */
static void fill_operands(void *A, void *B, int N, size_t bytes, cudaDataType_t t)
{
    uint64_t r = 0x9e3779b97f4a7c15ull;
    const size_t cnt = (size_t)N * N * (t == CUDA_C_64F || t == CUDA_C_32F ? 2 : 1);
    std::vector<unsigned char> hv(bytes);
    for (size_t i = 0; i < cnt; ++i) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17; /* xorshift64 */
        const double v = (double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0;
        const unsigned sg = v < 0, m = (unsigned)(r & 0x3ff);
        if (t == CUDA_R_16F) ((unsigned short *)hv.data())[i] = (unsigned short)(sg << 15 | 14u << 10 | m);           /* [0.5, 1) */
        else if (t == CUDA_R_16BF) ((unsigned short *)hv.data())[i] = (unsigned short)(sg << 15 | 126u << 7 | (m & 0x7f)); /* [0.5, 1) */
        else if (t == CUDA_R_64F || t == CUDA_C_64F) ((double *)hv.data())[i] = v;
        else ((float *)hv.data())[i] = (float)v;
    }
    cudaMemcpy(A, hv.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hv.data(), bytes, cudaMemcpyHostToDevice);
}

/* Raw cuBLAS rates on this GPU for the compute types the precision modes could use, square
   8192^3 (status printed: an unsupported type says so). Answers issue 12's questions: do the
   emulated types run, and pay, on Hopper; do ZGEMM/ZHERK use the FP64 tensor cores. */
static void probe()
{
    const int N = 8192;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { printf("probe: no cublas\n"); return; }
    void *A = nullptr, *B = nullptr, *C = nullptr;
    const size_t bytes = (size_t)N * N * 16;
    if (cudaMalloc(&A, bytes) != cudaSuccess || cudaMalloc(&B, bytes) != cudaSuccess || cudaMalloc(&C, bytes) != cudaSuccess) {
        printf("probe: no memory\n"); return;
    }
    auto fill = [&](cudaDataType_t t) { fill_operands(A, B, N, bytes, t); }; /* in the probe's format */
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    struct P { const char *name; int kind; cudaDataType_t t; cublasComputeType_t ct; int strategy; double flops_per; };
    const double n3 = (double)N * N * N;
    P ps[] = {
        {"sgemm fp32", 0, CUDA_R_32F, CUBLAS_COMPUTE_32F, 0, 2},
        {"sgemm tf32", 0, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 0, 2},
        {"sgemm bf16x9 (default strategy)", 0, CUDA_R_32F, CUBLAS_COMPUTE_32F_EMULATED_16BFX9, 0, 2},
        {"sgemm bf16x9 (eager)", 0, CUDA_R_32F, CUBLAS_COMPUTE_32F_EMULATED_16BFX9, 2, 2},
        {"hgemm fp16 in, fp32 acc", 0, CUDA_R_16F, CUBLAS_COMPUTE_32F, 0, 2},
        {"bf16 in, fp32 acc", 0, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0, 2},
        {"dgemm fp64", 0, CUDA_R_64F, CUBLAS_COMPUTE_64F, 0, 2},
        {"dgemm fixedpoint (default strategy)", 0, CUDA_R_64F, CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT, 0, 2},
        {"dgemm fixedpoint (eager)", 0, CUDA_R_64F, CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT, 2, 2},
        {"zgemm", 1, CUDA_C_64F, CUBLAS_COMPUTE_64F, 0, 8},
        {"zherk (lower, half)", 2, CUDA_C_64F, CUBLAS_COMPUTE_64F, 0, 4},
        {"cgemm fp32", 3, CUDA_C_32F, CUBLAS_COMPUTE_32F, 0, 8},
        {"cherk fp32 (lower, half)", 4, CUDA_C_32F, CUBLAS_COMPUTE_32F, 0, 4},
    };
    cudaDataType_t filled = CUDA_R_8I;
    for (auto &pp : ps) {
        if (pp.t != filled) { fill(pp.t); filled = pp.t; }
        cublasSetEmulationStrategy(h, pp.strategy ? CUBLAS_EMULATION_STRATEGY_EAGER : CUBLAS_EMULATION_STRATEGY_DEFAULT);
        std::vector<double> t;
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r < 4 && st == CUBLAS_STATUS_SUCCESS; ++r) {
            cudaEventRecord(e0, 0);
            if (pp.kind == 0) {
                const float a32 = 1, b32 = 0;
                const double a64 = 1, b64 = 0;
                const bool d = pp.t == CUDA_R_64F;
                st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, d ? (const void *)&a64 : (const void *)&a32, A, pp.t, N, B, pp.t, N,
                                  d ? (const void *)&b64 : (const void *)&b32, C, d ? CUDA_R_64F : CUDA_R_32F, N, pp.ct, CUBLAS_GEMM_DEFAULT);
            } else if (pp.kind == 1) {
                cuDoubleComplex one = make_cuDoubleComplex(1, 0), zero = make_cuDoubleComplex(0, 0);
                st = cublasZgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, N, N, N, &one, (cuDoubleComplex *)A, N, (cuDoubleComplex *)B, N, &zero, (cuDoubleComplex *)C, N);
            } else if (pp.kind == 2) {
                double one = 1, zero = 0;
                st = cublasZherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, N, N, &one, (cuDoubleComplex *)A, N, &zero, (cuDoubleComplex *)C, N);
            } else if (pp.kind == 3) {
                cuComplex one = make_cuComplex(1, 0), zero = make_cuComplex(0, 0);
                st = cublasCgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, N, N, N, &one, (cuComplex *)A, N, (cuComplex *)B, N, &zero, (cuComplex *)C, N);
            } else {
                float one = 1, zero = 0;
                st = cublasCherk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_C, N, N, &one, (cuComplex *)A, N, &zero, (cuComplex *)C, N);
            }
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r > 0) t.push_back(ms);
        }
        cudaError_t ce = cudaGetLastError();
        if (st != CUBLAS_STATUS_SUCCESS || ce != cudaSuccess) {
            printf("probe %-36s status %d (%s)\n", pp.name, (int)st, cudaGetErrorString(ce));
            continue;
        }
        const double ms = median(t);
        printf("probe %-36s %9.3f ms %8.1f TFLOP/s\n", pp.name, ms, pp.flops_per * n3 / (ms * 1e9));
        char line[256];
        snprintf(line, sizeof line, "{\"probe\": \"%s\", \"n\": %d, \"ms\": %.4f, \"tflops\": %.2f}", pp.name, N, ms, pp.flops_per * n3 / (ms * 1e9));
        g_probe_rows.push_back(line);
    }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    cudaFree(A); cudaFree(B); cudaFree(C);
    cublasDestroy(h);
}

/* ---- the roofline of issue 26 (bench/run.sh gpu-bench CASES=roof; docs/benchmarks.md) ----
   The table in one process: the floors of this GPU, then each row (zz reps=2, K(X,X) on
   the device, the planned engine of the precision asked for) with its floor and its share. */
struct Floors {
    double write_gps[3] = {0, 0, 0}; /* the write of K (write_floor), Gpairs/s at n = 32768, 16384, 4096 */
    double fp16 = 0, tf32 = 0, fp32 = 0; /* dense TFLOP/s: cuBLAS GEMM fp16 in / fp32 acc, tf32, fp32 (FP32 cores) */
};
static const int64_t roof_n[3] = {32768, 16384, 4096};

/* TFLOP/s (2 N^3 / t) of cublasGemmEx A^T B, N^3, operands of type t, fp32 output, compute type
   ct, the median of 5 after a warm-up (as probe's); 0 where it fails */
static double gemm_tflops(cublasHandle_t h, int N, cudaDataType_t t, cublasComputeType_t ct, const void *A, const void *B, void *C)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<double> ms;
    const float one = 1, zero = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int r = 0; r < 6 && st == CUBLAS_STATUS_SUCCESS; ++r) {
        cudaEventRecord(e0, 0);
        st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, t, N, B, t, N, &zero, C, CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float x = 0;
        cudaEventElapsedTime(&x, e0, e1);
        if (r) ms.push_back(x);
    }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    const cudaError_t ce = cudaGetLastError();
    if (st != CUBLAS_STATUS_SUCCESS || ce != cudaSuccess) { printf("roof gemm: status %d (%s)\n", (int)st, cudaGetErrorString(ce)); return 0; }
    const double t_ms = median(ms);
    return t_ms > 0 ? 2.0 * N * N * (double)N / (t_ms * 1e9) : 0;
}

/* This GPU's floors: the write of K at each n of the rows, and the dense GEMM rates at 8192^3
   (where cuBLAS reaches the peak; a few ms each). Each is printed and kept in the probe rows. */
static Floors roof_floors()
{
    Floors f;
    for (int i = 0; i < 3; ++i) f.write_gps[i] = write_floor(roof_n[i]);
    const int N = 8192;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { printf("roof: no cublas\n"); return f; }
    void *A = nullptr, *B = nullptr, *C = nullptr;
    const size_t bytes = (size_t)N * N * 4;
    if (cudaMalloc(&A, bytes) != cudaSuccess || cudaMalloc(&B, bytes) != cudaSuccess || cudaMalloc(&C, bytes) != cudaSuccess) {
        printf("roof: no memory for the GEMM rates\n");
    } else {
        struct G { const char *name; cudaDataType_t t; cublasComputeType_t ct; double *out; } gs[] = {
            {"hgemm fp16 in, fp32 acc", CUDA_R_16F, CUBLAS_COMPUTE_32F, &f.fp16},
            {"sgemm tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, &f.tf32},
            {"sgemm fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F, &f.fp32}};
        cudaDataType_t filled = CUDA_R_8I;
        for (auto &g : gs) {
            if (g.t != filled) { fill_operands(A, B, N, bytes, g.t); filled = g.t; }
            *g.out = gemm_tflops(h, N, g.t, g.ct, A, B, C);
            printf("roof floor: %-24s %dx%dx%d %8.1f TFLOP/s = %.1f T multiply-adds/s\n", g.name, N, N, N, *g.out, *g.out / 2);
            char line[160];
            snprintf(line, sizeof line, "{\"probe\": \"%s\", \"n\": %d, \"ms\": %.4f, \"tflops\": %.2f}", g.name, N,
                     *g.out > 0 ? 2.0 * N * N * (double)N / (*g.out * 1e9) : 0.0, *g.out);
            g_probe_rows.push_back(line);
        }
    }
    cudaFree(A); cudaFree(B); cudaFree(C);
    cublasDestroy(h);
    fflush(stdout);
    return f;
}

/* What the plan's Gram runs on: the kernel (name), the GEMM rate behind it (TFLOP/s of f, 0: not
   measured), the products per inner product (fp32x3: three fp16 products) and the bound's name. */
struct Compute { std::string kernel; double tflops = 0, products = 1; const char *bound = "compute ?"; };
static Compute plan_compute(const qk_plan &p, const Floors &f)
{
    Compute c;
    const qk_gpu_engine e = p.engine;
    const int cfg = qk__plan_cfg_runs(&p, e, p.kernel_cfg);
    const char *en = qk__engine_name(e) ? qk__engine_name(e) : "?";
    char k[96];
    if (e == QK_GPU_FUSED) snprintf(k, sizeof k, "fused cfg %d (%s)", cfg, qk__fused_cfg_name(cfg));
    else if (qk__engine_tcf(e)) snprintf(k, sizeof k, "%s cfg %d (%s)", en, cfg, cfg == 4 ? "wgmma" : "mma.sync");
    else snprintf(k, sizeof k, "%s (cuBLAS + epilogue)", en);
    c.kernel = k;
    if (qk__engine_tc(e) && e != QK_GPU_TC_FP64 && p.path == QK_PATH_COMPLEX) {
        const char *m4 = getenv("QK_TC_4M");
        if (!(m4 && m4[0] == '1')) c.kernel = std::string(en) + " (cuBLAS Gauss + epilogue)";
    }
    /* no fp64 rate measured, and no statevector products off the statevector paths: the write bounds */
    if (p.precision == QK_PRECISION_FP64 || (p.path != QK_PATH_REAL && p.path != QK_PATH_COMPLEX)) return c;
    switch (e) {
    case QK_GPU_FUSED:
        if (cfg == 8) { c.tflops = f.fp16; c.products = 3; c.bound = "compute fp16 x3"; } /* hi/lo fp16 splits on the tensor cores */
        else { c.tflops = f.fp32; c.bound = "compute fp32"; }
        break;
    case QK_GPU_CUBLAS: c.tflops = f.fp32; c.bound = "compute fp32"; break;
    case QK_GPU_CUBLAS_3M: c.tflops = f.fp32; c.products = 0.75; c.bound = "compute fp32 (3m)"; break; /* 3 real products of 4 */
    case QK_GPU_TC_TF32: case QK_GPU_TCF_TF32: c.tflops = f.tf32; c.bound = "compute tf32"; break;
    case QK_GPU_TC_FP32X3: case QK_GPU_TCF_FP32X3: c.tflops = f.fp16; c.products = 3; c.bound = "compute fp16 x3"; break;
    case QK_GPU_TC_FP16: case QK_GPU_TCF_FP16: c.tflops = f.fp16; c.bound = "compute fp16"; break;
    case QK_GPU_TC_BF16: c.tflops = f.fp16; c.bound = "compute bf16 (fp16 rate)"; break;
    default: break;
    }
    /* complex states on the cuBLAS tensor-core engines (not fp64): Gauss's three real products of
       length D where the real form takes two of 2D (src/cuda/blas.cuh; QK_TC_4M=1 keeps the real form) */
    const char *m4 = getenv("QK_TC_4M");
    if (qk__engine_tc(e) && e != QK_GPU_TC_FP64 && p.path == QK_PATH_COMPLEX && !(m4 && m4[0] == '1')) {
        c.products *= 0.75;
    }
    return c;
}

/* The plan's lines naming what it took (qk_plan_describe's engine, config and precision lines),
   on one line */
static std::string plan_lines(const qk_plan &p)
{
    char buf[8192];
    qk_plan_describe(&p, buf, sizeof buf);
    std::string out;
    for (char *l = strtok(buf, "\n"); l; l = strtok(nullptr, "\n")) {
        while (*l == ' ') ++l;
        if (!strncmp(l, "engine:", 7) || !strncmp(l, "config:", 7) || !strncmp(l, "precision:", 10) || !strncmp(l, "K(", 2))
            out += (out.empty() ? "" : " | ") + std::string(l);
    }
    return out;
}

/* s with the characters JSON would need escaped replaced (quotes, backslashes, controls) */
static std::string json_safe(std::string s)
{
    for (auto &ch : s)
        if (ch == '"' || ch == '\\' || (unsigned char)ch < 0x20) ch = '\'';
    return s;
}

/* One row of the table: K(X,X) on the device in precision prec (the planned engine), its floor
   min(write, compute) and its share. Compute floor (Gpairs/s of K) = the rate (multiply-adds/s,
   TFLOP/s / 2) over the multiply-adds per entry of K: complex states of D = 2^q amplitudes need
   4D real multiply-adds a computed pair (Re and Im of <a|b>), real ones D, K(X,X) computes half
   of the pairs (2D or D/2 an entry), times the products (fp32x3: 3; Gauss's form of the cuBLAS
   tensor-core engines and CGEMM3M: 3/4 of the real form's, plan_compute). states: the state rate
   against the write of the states (D x 8 bytes each). */
static void roof_row(const char *name, const qk_map &m, const std::vector<double> &x, int64_t n, qk_precision prec, const Floors &f,
                     double write_gps, bool states)
{
    const size_t before = rows.size();
    settle();
    if (run_case(name, m, x, n, QK_OUTPUT_DEVICE, -1, 0, false, false, 0, false, prec) != 0 || rows.size() == before) return;
    Row &r = rows.back();
    const qk_plan &p = g_last_plan;
    const Compute c = plan_compute(p, f);
    const double D = std::ldexp(1.0, m.n_qubits);
    const bool cplx = p.path == QK_PATH_COMPLEX;
    const char *asked = prec == QK_PRECISION_DEFAULT ? "default" : prec_name(prec);
    const std::string pl = plan_lines(p);
    char js[1024];
    if (states) {
        /* the row names the state kernel, not the Gram engine the plan also carries: one pass in
           shared memory up to QK__PASS_QUBITS, the structured passes through device memory above */
        const std::string sk = m.n_qubits <= QK__PASS_QUBITS ? "states: one pass in shared memory" : "states: structured passes";
        const double t = memset_ms((size_t)n * (size_t)D * 8); /* the states' bytes, complex64 */
        const double v = r.states_ms > 0 ? n / r.states_ms * 1e3 : 0, fl = t > 0 ? n / t * 1e3 : 0;
        printf("roof   %2d q n=%6lld states %-6s %-40s %10.0f states/s | floor %10.0f (write of %lld x %.0f x 8 bytes: %.3f ms) | share %5.1f %%\n",
               m.n_qubits, (long long)n, r.precision.c_str(), sk.c_str(), v, fl, (long long)n, D, t, fl > 0 ? 100 * v / fl : 0.0);
        snprintf(js, sizeof js, ", \"roof\": \"states\", \"asked\": \"%s\", \"kernel\": \"%s\", \"floor_states_per_s\": %.1f, "
                 "\"bound\": \"write\", \"share\": %.4f, \"plan\": \"%s\"", asked, json_safe(sk).c_str(), fl, fl > 0 ? v / fl : 0.0,
                 json_safe(pl).c_str());
        r.roof = js;
    } else {
        const double macs = c.products * (cplx ? 2 * D : D / 2);                 /* per entry of K */
        const double cf = c.tflops > 0 ? c.tflops * 1e12 / 2 / macs / 1e9 : 0;   /* Gpairs/s; 0: not measured */
        const double v = r.gram_ms > 0 ? (double)n * n / r.gram_ms / 1e6 : 0;
        const bool wb = cf <= 0 || (write_gps > 0 && write_gps <= cf);
        const double fl = wb ? write_gps : cf;
        const char *bound = wb ? (cf > 0 ? "write" : "write (compute not measured)") : c.bound;
        printf("roof   %2d q n=%6lld %-7s %-6s %-40s %9.2f Gpairs/s | floor %9.2f (%s; write %.1f, %s %.1f at %.0f multiply-adds an entry) | share %5.1f %%\n",
               m.n_qubits, (long long)n, asked, r.precision.c_str(), c.kernel.c_str(), v, fl, bound, write_gps, c.bound, cf, macs,
               fl > 0 ? 100 * v / fl : 0.0);
        char cfs[32] = "null";
        if (cf > 0) snprintf(cfs, sizeof cfs, "%.3f", cf);
        snprintf(js, sizeof js, ", \"roof\": \"gram\", \"asked\": \"%s\", \"kernel\": \"%s\", \"Gpairs_s\": %.4f, \"floor_Gpairs_s\": %.3f, "
                 "\"write_floor_Gpairs_s\": %.3f, \"compute_floor_Gpairs_s\": %s, \"macs_per_entry\": %.0f, \"bound\": \"%s\", \"share\": %.4f, "
                 "\"plan\": \"%s\"", asked, json_safe(c.kernel).c_str(), v, fl, write_gps, cfs, macs, bound, fl > 0 ? v / fl : 0.0,
                 json_safe(pl).c_str());
        r.roof = js;
    }
    printf("   plan: %s\n", pl.c_str());
    fflush(stdout);
}

/* The rows: 4 q n=32768 default; 7 q default; 8 q default, fp32x3, fp16; 12 q n=16384
   fp32x3, fp16; 16 q n=4096 fp32x3, fp16 and the 16-qubit state rate (as zz16 measures it: the
   fp32 run's states_ms). qmask: the qubit counts whose rows run (bit q; --cases roof4, roof7,
   roof8, roof12, roof16 pick some for an A/B, the floors measured all the same) */
static void roof(std::mt19937_64 &rng, unsigned qmask = ~0u)
{
    const int saved = reps;
    reps = std::max(reps, 3);
    const Floors f = roof_floors();
    std::uniform_real_distribution<double> u(0, 1);
    struct R { int q; int ni; std::vector<qk_precision> modes; } rs[] = {
        {4, 0, {QK_PRECISION_DEFAULT}},
        {7, 0, {QK_PRECISION_DEFAULT}},
        {8, 0, {QK_PRECISION_DEFAULT, QK_PRECISION_FP32X3, QK_PRECISION_FP16}},
        {12, 1, {QK_PRECISION_FP32X3, QK_PRECISION_FP16}},
        {16, 2, {QK_PRECISION_FP32X3, QK_PRECISION_FP16}}};
    for (auto &c : rs) {
        if (!((qmask >> c.q) & 1u)) continue;
        const int64_t n = roof_n[c.ni];
        BMap b; build_zz(b, c.q, 2);
        std::vector<double> x((size_t)n * c.q);
        for (auto &v : x) v = u(rng) * 2 * M_PI;
        char name[16];
        snprintf(name, sizeof name, "roof%d", c.q);
        for (auto md : c.modes) roof_row(name, b.m, x, n, md, f, f.write_gps[c.ni], false);
        if (c.q == 16) roof_row(name, b.m, x, n, QK_PRECISION_FP32, f, f.write_gps[c.ni], true);
    }
    reps = saved;
}

int main(int argc, char **argv)
{
    const char *json = nullptr, *commit_file = nullptr;
    std::string cases = "zz4,zz8,zz12,zz16,hea12,host8,e2e8,amp16,tune";
    std::string xy_modes = "fp32,default,fp16";   /* --xy-modes: the xy cases' modes, in this order */
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc) commit_file = argv[++i];
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--xy-modes") && i + 1 < argc) xy_modes = argv[++i];
    }
    if (qk_cuda_device_count() <= 0) { printf("qk-bench: no CUDA device\n"); return 77; }
    {
        qk_ctx_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CUDA;
        cd.n_cuda_devices = 1;   /* device 0 alone: qk-bench measures one GPU (qk-mgpu-bench: several) */
        cd.autotune = -1;
        if (qk_ctx_create(&cd, &g_ctx) != QK_OK) { printf("qk-bench: %s\n", qk_last_error()); return 1; }
    }
    qk_device_info &info = g_info;
    char err[256];
    qk_cuda_device_query(0, &info, err, sizeof err);
    std::vector<std::string> tune_rows;
    std::mt19937_64 rng(1234);
    std::uniform_real_distribution<double> u(0, 1);
    auto has = [&](const char *c) { return ("," + cases + ",").find(std::string(",") + c + ",") != std::string::npos; };
    struct ZZ { const char *name; int q; int64_t n; };
    ZZ zz[] = {{"zz2", 2, 32768}, {"zz3", 3, 32768}, {"zz4", 4, 32768}, {"zz5", 5, 32768}, {"zz6", 6, 32768},
               {"zz7", 7, 32768}, {"zz8", 8, 32768}, {"zz12", 12, 16384}, {"zz14", 14, 4096}, {"zz15", 15, 4096}, {"zz16", 16, 4096}, {"zz20", 20, 256}};
    for (auto &c : zz) {
        if (!has(c.name)) continue;
        BMap b; build_zz(b, c.q, 2);
        std::vector<double> x((size_t)c.n * c.q);
        for (auto &v : x) v = u(rng) * 2 * M_PI;
        run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, -1, 0, false, false);
        /* the GPU default (auto at fp32-class: fp32x3 from 7 qubits) */
        if (c.q >= 7) run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, -1, 0, false, false, 0, false, QK_PRECISION_DEFAULT);
        run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, c.q >= 7 ? 0 : 1, c.q >= 7 ? c.n : 0, false, false);
        if (c.q < 7) run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, 0, 0, false, false, 6);
        if (c.q < 6) run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, 0, 0, false, false, 1); /* the 64x64 tile the persistent kernel replaced */
        if (c.q >= 7) run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, 2, 0, false, false);
        if (c.q >= 7) run_case(c.name, b.m, x, c.n, QK_OUTPUT_DEVICE, 1, c.n, false, false); /* one slab: no overlap */
    }
    for (int q = 6; q <= 8; ++q) {
        /* K(X,Y) of n x n on the device, Y a copy of X (the diagonal still 1 for the sanity
           check, no symmetry for the planner to use): the planned fp32 and default (fp32x3) */
        char name[8];
        snprintf(name, sizeof name, "xy%d", q);
        if (!has(name)) continue;
        BMap b; build_zz(b, q, 2);
        const int64_t n = 32768;
        std::vector<double> x((size_t)n * q);
        for (auto &v : x) v = u(rng) * 2 * M_PI;
        const std::vector<double> y = x;
        auto mode = [&](const char *md) { return ("," + xy_modes + ",").find(std::string(",") + md + ",") != std::string::npos; };
        if (mode("fp32")) run_case(name, b.m, x, n, QK_OUTPUT_DEVICE, -1, 0, false, false, 0, false, QK_PRECISION_FP32, nullptr, &y);
        settle();
        if (mode("default")) run_case(name, b.m, x, n, QK_OUTPUT_DEVICE, -1, 0, false, false, 0, false, QK_PRECISION_DEFAULT, nullptr, &y);
        settle();
        if (mode("fp16")) run_case(name, b.m, x, n, QK_OUTPUT_DEVICE, -1, 0, false, false, 0, false, QK_PRECISION_FP16, nullptr, &y);
    }
    if (has("small")) {
        /* the few-qubit kernels, zz reps=2 at 2..6 qubits, n = 32768, K(X,X) on the device: the
           default's plan, fp32's plan, the persistent SIMT kernel (7), its tensor-core form (8),
           the 64x64 tile (1) and the TMA fp32x3 kernel (fused tensor-core configuration 4), each
           against an fp64 K; the write floor in the same job */
        write_floor(32768);
        for (int q = 2; q <= 6; ++q) {
            BMap b; build_zz(b, q, 2);
            std::vector<double> x((size_t)32768 * q);
            for (auto &v : x) v = u(rng) * 2 * M_PI;
            char name[16];
            snprintf(name, sizeof name, "small%d", q);
            std::vector<Mode> md = {{QK_PRECISION_DEFAULT, -1, 0}, {QK_PRECISION_FP32, -1, 0}, {QK_PRECISION_FP32, 0, 8}, {QK_PRECISION_FP32, 0, 1}};
            if (q <= 5) md.push_back({QK_PRECISION_FP32, 0, 7});
            md.push_back({QK_PRECISION_FP32X3, 9, 4});   /* the TMA fp32x3 kernel (qk__k_wg3t), the default from 5 qubits on wgmma devices */
            modes_case(name, b.m, x, 32768, md);
        }
    }
    if (has("hea12")) {
        BMap b; build_hea(b, 12, 2, rng);
        std::vector<double> x((size_t)16384 * 12);
        for (auto &v : x) v = u(rng) * M_PI;
        run_case("hea12", b.m, x, 16384, QK_OUTPUT_DEVICE, -1, 0, false, false);
        run_case("hea12", b.m, x, 16384, QK_OUTPUT_DEVICE, 0, 16384, false, false);
    }
    if (has("host8") || has("e2e8") || has("e2e6")) {
        BMap b; build_zz(b, 8, 2);
        const int blas = -1;
        /* pinned, pageable (touched: a reused buffer), pageable fresh (untouched pages) */
        if (has("host8")) {
            std::vector<double> x((size_t)32768 * 8);
            for (auto &v : x) v = u(rng) * 2 * M_PI;
            run_case("host8", b.m, x, 32768, QK_OUTPUT_HOST, blas, 0, true, false);
            run_case("host8", b.m, x, 32768, QK_OUTPUT_HOST, blas, 0, false, false);
            run_case("host8", b.m, x, 32768, QK_OUTPUT_HOST, blas, 0, false, false, 0, true);
        }
        if (has("e2e8")) {
            std::vector<double> x((size_t)20000 * 8);
            for (auto &v : x) v = u(rng) * 2 * M_PI;
            run_case("e2e8", b.m, x, 20000, QK_OUTPUT_HOST, blas, 0, true, true);
            run_case("e2e8", b.m, x, 20000, QK_OUTPUT_HOST, blas, 0, false, true);
            run_case("e2e8", b.m, x, 20000, QK_OUTPUT_HOST, blas, 0, false, true, 0, true);
        }
        if (has("e2e6")) { /* 6 q n = 40000: 6.4 GB of K */
            BMap b6; build_zz(b6, 6, 2);
            std::vector<double> x((size_t)40000 * 6);
            for (auto &v : x) v = u(rng) * 2 * M_PI;
            run_case("e2e6", b6.m, x, 40000, QK_OUTPUT_HOST, blas, 0, true, true);
            run_case("e2e6", b6.m, x, 40000, QK_OUTPUT_HOST, blas, 0, false, true);
            run_case("e2e6", b6.m, x, 40000, QK_OUTPUT_HOST, blas, 0, false, true, 0, true);
        }
    }
    if (has("amp16")) {
        /* amplitude encoding from host float64, 16 qubits, batch 64 (pinned source, as the peer) */
        const int64_t n = 4096; const int d = 65536;
        double *x = nullptr;
        cudaMallocHost((void **)&x, (size_t)n * d * sizeof(double));
        for (int64_t i = 0; i < n * d; ++i) x[i] = u(rng);
        void *dout = nullptr;
        cudaMalloc(&dout, (size_t)n * d * sizeof(float));
        std::vector<double> t;
        for (int r = 0; r < reps + 1; ++r) {
            double sec = 0;
            if (qk_cuda_amplitude_encode(x, n, d, 16, QK_PRECISION_FP32, dout, 64, &sec, err, sizeof err) != QK_OK) { printf("amp16: %s\n", err); break; }
            if (r) t.push_back(sec);
        }
        double sec = median(t);
        printf("amp16 encode host f64 pinned, batch 64: %.3f ms for %lld vectors: %.0f vectors/s (%.1f GB/s H2D)\n", sec * 1e3,
               (long long)n, n / sec, n * (double)d * 8 / sec * 1e-9);
        Row row;
        row.name = "amp16"; row.map = "amplitude"; row.q = 16; row.n = n; row.output = "device"; row.engine = "encode batch 64";
        row.gram_ms = 0; row.states_ms = sec * 1e3; row.output_ms = 0; row.e2e_ms = sec * 1e3; row.busy0 = row.busy1 = 0; row.deliver_ms = 0;
        rows.push_back(row);
        cudaFree(dout);
        /* the whole K(X,X) from host float64 X through qk_gram (the encoder feeds the Gram: issue
           11 item 3), K on the device; pageable X as a user's numpy array is */
        {
            qk_map *am = nullptr;
            if (qk_map_parse("amplitude", d, &am) == QK_OK) {
                std::vector<double> xp(x, x + (size_t)n * d);
                run_case("amp16g", *am, xp, n, QK_OUTPUT_DEVICE, -1, 0, false, true);
                qk_map_free(am);
            }
        }
        cudaFreeHost(x);
    }
    if (has("tune")) {
        /* autotune sweep: every candidate on the real shape (n capped at 8192 for q >= 12) */
        struct TC { const char *name; int q; int64_t n; bool hea; } tc[] = {
            {"zz4", 4, 32768, false}, {"zz6", 6, 32768, false}, {"zz8", 8, 32768, false}, {"zz12", 12, 8192, false},
            {"zz16", 16, 2048, false}, {"hea12", 12, 8192, true}};
        for (auto &c : tc) {
            BMap b;
            if (c.hea) build_hea(b, c.q, 2, rng); else build_zz(b, c.q, 2);
            double dummy = 0;
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = &dummy; g.n_x = c.n; g.out = &dummy; g.output = QK_OUTPUT_DEVICE; g.precision = QK_PRECISION_FP32;
            qk_plan p = plan_for(b.m, g, -1, 0, 0);
            qk_cuda_tune_result tr;
            if (qk_cuda_tune_gram(&p, c.n, reps, &tr, err, sizeof err) != QK_OK) { printf("tune %s: %s\n", c.name, err); continue; }
            int fixed = -1;
            for (int i = 0; i < tr.n; ++i)
                if ((p.engine != QK_GPU_FUSED && tr.blas[i] == QK_GPU_CUBLAS) || (p.engine == QK_GPU_FUSED && tr.blas[i] == QK_GPU_FUSED && tr.cfg[i] == (c.q <= 5 ? 1 : c.hea ? 4 : 2))) fixed = i;
            char line[512];
            int len = snprintf(line, sizeof line, "{\"case\": \"%s\", \"n\": %lld, \"best\": %d, \"fixed\": %d, \"candidates\": [", c.name,
                               (long long)tr.n_samples, tr.best, fixed);
            printf("tune %-6s n=%6lld:", c.name, (long long)tr.n_samples);
            for (int i = 0; i < tr.n; ++i) {
                char tcfn[48];
                const qk_gpu_engine te = (qk_gpu_engine)tr.blas[i];
                snprintf(tcfn, sizeof tcfn, "%s/cfg%d", qk__engine_name(te) ? qk__engine_name(te) : "?", tr.cfg[i]);
                const char *nm = qk__engine_tcf(te) ? tcfn : te != QK_GPU_FUSED ? (qk__engine_name(te) ? qk__engine_name(te) : "?")
                                                                           : qk__fused_cfg_name(tr.cfg[i]);
                printf(" %s %.3f ms%s%s |", nm, tr.ms[i], i == tr.best ? " (best)" : "", i == fixed ? " (fixed)" : "");
                len += snprintf(line + len, sizeof line - len, "%s{\"engine\": \"%s\", \"ms\": %.4f}", i ? ", " : "", nm, tr.ms[i]);
            }
            printf("\n");
            snprintf(line + len, sizeof line - len, "]}");
            tune_rows.push_back(line);
        }
    }
    {   /* precision modes: prec runs them all, prec6 / prec8 / prec12 / prec16 / prechea12 / prec64 one each */
        struct PC { const char *name; int q; int64_t n; bool hea, f64; } pc[] = {
            {"prec6", 6, 32768, false, false}, {"prec8", 8, 32768, false, false}, {"prec12", 12, 16384, false, false}, {"prec16", 16, 4096, false, false},
            {"prechea12", 12, 16384, true, false}, {"prec64", 8, 16384, false, true}};
        for (auto &c : pc) {
            if (!has(c.name) && !has("prec")) continue;
            BMap b;
            if (c.hea) build_hea(b, c.q, 2, rng); else build_zz(b, c.q, 2);
            std::vector<double> x((size_t)c.n * c.q);
            for (auto &v : x) v = u(rng) * (c.hea ? M_PI : 2 * M_PI);
            prec_case(c.name, b.m, x, c.n, c.f64);
        }
    }
    {   /* fused tensor-core kernel vs cuBLAS engines: tc runs them all, tc6 ... tc10 / tc12 / tc16 / tchea12 one each */
        struct TC { const char *name; int q; int64_t n; bool hea; } tc[] = {
            {"tc6", 6, 32768, false}, {"tc7", 7, 32768, false}, {"tc8", 8, 32768, false}, {"tc9", 9, 32768, false},
            {"tc10", 10, 32768, false}, {"tc12", 12, 16384, false}, {"tc16", 16, 4096, false}, {"tchea12", 12, 16384, true}};
        for (auto &c : tc) {
            if (!has(c.name) && !has("tc")) continue;
            BMap b;
            if (c.hea) build_hea(b, c.q, 2, rng); else build_zz(b, c.q, 2);
            std::vector<double> x((size_t)c.n * c.q);
            for (auto &v : x) v = u(rng) * (c.hea ? M_PI : 2 * M_PI);
            tc_case(c.name, b.m, x, c.n);
        }
    }
    if (has("roof")) roof(rng);
    else {
        unsigned qm = 0;
        for (int q : {4, 7, 8, 12, 16})
            if (has(("roof" + std::to_string(q)).c_str())) qm |= 1u << q;
        if (qm) roof(rng, qm);
    }
    if (has("probe")) probe();
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { printf("cannot write %s\n", json); return 1; }
        int drv = 0, rt = 0;
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        char commit[64] = "unknown";
        if (commit_file) {
            FILE *c = fopen(commit_file, "r");
            if (c) { if (fscanf(c, "%63s", commit) != 1) strcpy(commit, "unknown"); fclose(c); }
        }
        fprintf(f, "{\n \"gpu\": \"%s\", \"cc\": \"%d.%d\", \"sms\": %d, \"cuda_driver\": %d, \"cuda_runtime\": %d,\n \"commit\": \"%s\",\n \"rows\": [\n",
                info.name, info.cc_major, info.cc_minor, info.sm_count, drv, rt, commit);
        for (size_t i = 0; i < rows.size(); ++i) {
            const Row &r = rows[i];
            double pairs = (double)r.n * r.n;
            char errs[96] = "";
            if (r.max_err >= 0) snprintf(errs, sizeof errs, ", \"max_err\": %.3e, \"diag_err\": %.3e", r.max_err, r.diag_err);
            fprintf(f, "  {\"case\": \"%s\", \"map\": \"%s\", \"qubits\": %d, \"n\": %lld, \"precision\": \"%s\", \"output\": \"%s\", \"engine\": \"%s\", "
                       "\"gram_ms\": %.4f, \"gram_Gpairs_s\": %.4f, \"output_ms\": %.4f, \"output_Gpairs_s\": %.4f, "
                       "\"states_ms\": %.4f, \"states_per_s\": %.1f, \"e2e_ms\": %.3f, \"busy_compute_ms\": %.3f, \"busy_copy_ms\": %.3f, \"host_delivery_ms\": %.3f%s%s}%s\n",
                    r.name.c_str(), r.map.c_str(), r.q, (long long)r.n, r.precision.c_str(), r.output.c_str(), r.engine.c_str(), r.gram_ms,
                    r.gram_ms > 0 ? pairs / r.gram_ms / 1e6 : 0.0, r.output_ms, r.output_ms > 0 ? pairs / r.output_ms / 1e6 : 0.0, r.states_ms,
                    r.states_ms > 0 ? r.n / r.states_ms * 1e3 : 0.0, r.e2e_ms, r.busy0, r.busy1, r.deliver_ms, errs, r.roof.c_str(),
                    i + 1 < rows.size() ? "," : "");
        }
        fprintf(f, " ],\n \"tune\": [\n");
        for (size_t i = 0; i < tune_rows.size(); ++i) fprintf(f, "  %s%s\n", tune_rows[i].c_str(), i + 1 < tune_rows.size() ? "," : "");
        fprintf(f, " ],\n \"probe\": [\n");
        for (size_t i = 0; i < g_probe_rows.size(); ++i) fprintf(f, "  %s%s\n", g_probe_rows[i].c_str(), i + 1 < g_probe_rows.size() ? "," : "");
        fprintf(f, " ]\n}\n");
        fclose(f);
    }
    return 0;
}
