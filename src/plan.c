#include "qk_internal.h"
/* >>planner ---- device info, planner, VRAM estimator ---- */
/* The GPU plan. Everything the CUDA engine (qk_cuda.cu) allocates is counted here:
     states      (n_x + n_y) x row bytes (bulk) or two state tiles
     scratch     per built state: its per-sample parameters (gate matrices and the dense
                 quadratic phase forms of qk_cuda.cu's program) and, for programs of more than
                 one pass (q > 13), a second state buffer
     K           host/callback output: all of K resident when it fits (symmetric slabs mirror
                 into later rows: half the pairs), else a ring of two slabs (full rows)
     workspace   cuBLAS path: one slab of <a|b> in complex (or real) T
   Staging (two pinned host slabs) is host memory, reported but not charged to the device.
   Engine choice: the fused SIMT kernel writes K once and wins where the job is write-bound (few
   qubits); cuBLAS runs the FP32 pipes near their peak and wins where it is compute-bound. So
   cuBLAS from QK__BLAS_MIN_QUBITS on (the measured crossover: docs/benchmarks.md, 'Figures behind the code's constants'). */
#define QK__BLAS_MIN_QUBITS 7

/* Tensor-core engines (plan.engine TC_*, qk_cuda.cu's qk__tc_products): the complex product in
   real form (Re <a|b> = a . b and Im <a|b> = a . rot(b) over the interleaved (re, im) rows, rot
   swapping each pair and negating one), real GEMMs over blocks of the upper triangle, the
   |.|^2 epilogue reading the Re and Im planes. Below QK__TC_MIN_QUBITS the Gram is bound by
   writing K, not by arithmetic, and the FP32 fused kernel (more accurate) is the faster one;
   at 6 qubits the tensor cores already win; at 4 qubits cuBLAS's C planes and the epilogue's
   second pass cost more than the arithmetic. FP32X3 sums hi*hi in chunks (a pass over C each),
   so it starts one qubit later (docs/benchmarks.md, 'Figures behind the code's constants'). */
#define QK__TC_MIN_QUBITS 6
static int qk__tc_min_qubits(qk_precision p) { return p == QK_PRECISION_FP32X3 ? QK__TC_MIN_QUBITS + 1 : QK__TC_MIN_QUBITS; }
/* ... on a device: fp32x3 of complex states from 5 qubits where the TMA-fed wgmma kernel runs
   (qk__k_wg3t): 1.3-2x the fused fp32 kernel (configuration 8) at 5 and 6 qubits, not faster at
   4 and below, where configuration 8 stays (docs/benchmarks.md, 'fp32x3 from 5 qubits') */
#define QK__TC_WG_MIN_QUBITS 5
static int qk__tc_min_qubits_on(qk_precision p, int wgmma, qk_path path)
{
    return p == QK_PRECISION_FP32X3 && wgmma && path == QK_PATH_COMPLEX ? QK__TC_WG_MIN_QUBITS : qk__tc_min_qubits(p);
}
#define QK__TC_WS_SHARE 0.45            /* share of the budget the tensor-core workspace may take */
/* The fused tensor-core kernel (plan.engine TCF_*, qk__engine_tcf_of the cuBLAS one) in the fixed
   table up to this many qubits, per mode: at 6 and 7 qubits it beats the cuBLAS engines in every
   mode (the Gram is short in k, so cuBLAS's C planes and the separate epilogue cost more than the
   MMAs), at 8 qubits only in FP16, from 9 qubits on cuBLAS wins (docs/benchmarks.md, 'Figures
   behind the code's constants'). Its configuration in the fixed table: 2 (64 x 64 tiles, 32 x 32
   per warp) up to 7 qubits, 1 (128 x 128, 64 x 32 per warp) at 8; the autotune still times both
   and cuBLAS per shape. On a device that runs wgmma (configuration 4), FP32X3 too up to 8 qubits:
   its TMA-fed persistent kernel for the triangle (qk__k_wg3t) is faster than cuBLAS + epilogue
   there (docs/benchmarks.md, 'fp32x3 through TMA, measured'). */
#define QK__TCF_MAX_QUBITS 7
#define QK__TCF_FP16_MAX_QUBITS 8
static int qk__tcf_max_qubits(qk_precision p, int wgmma)
{
    return p == QK_PRECISION_FP16 || (wgmma && p == QK_PRECISION_FP32X3) ? QK__TCF_FP16_MAX_QUBITS : QK__TCF_MAX_QUBITS;
}
/* the fixed table's configuration of the fused tensor-core kernel: 4 (wgmma) where the device
   runs it, FP16 and FP32X3 (docs/benchmarks.md, 'Figures behind the code's constants'); else 2 up
   to 7 qubits, 1 at 8 */
static int qk__tcf_fixed_cfg(int n_qubits, qk_precision p, int wgmma)
{
    if (wgmma && p != QK_PRECISION_TF32) return 4;
    return n_qubits <= 7 ? 2 : 1;
}
static qk_gpu_engine qk__tc_mode(qk_precision p) { return qk__tc_engine(p, 0); }
/* 1 when engine e is at least as accurate as precision p asks. FP32 plans keep their engines
   (FUSED, CUBLAS, CUBLAS_3M) only, so their results stay what they were. */
static int qk__blas_ok(qk_precision p, qk_path path, qk_gpu_engine e)
{
    if (e == QK_GPU_FUSED || e == QK_GPU_CUBLAS) return 1;
    if (p == QK_PRECISION_FP64) return e == QK_GPU_TC_FP64;
    if (e == QK_GPU_CUBLAS_3M) return path == QK_PATH_COMPLEX;
    if (qk__engine_tcf(e)) return qk__tc_mode(p) != QK_GPU_FUSED && e == qk__engine_tcf_of(qk__tc_mode(p));
    return e == qk__tc_mode(p) && p != QK_PRECISION_FP32;
}
/* Device bytes of one cuBLAS workspace slot (qk_cuda.cu's qk__blas_ws_bytes: keep the two in
   step): rows x cols inner products (complex two T, real one T) and, for the tensor-core
   engines, their operands in real form, W = 2^q (real) or 2^(q+1) (complex) values per state,
   for the rows, the columns and (complex) the rotated columns: TF32 one row of W floats, FP16
   and BF16 W halves, FP32X3 four blocks [hi lo hi hi] of W halves; FP64 real form the rotated
   columns only (W doubles). Complex states on the other tensor-core engines take Gauss's form
   (three planes of C; three operand planes of W / 2 values for the rows and for the columns,
   four when they are the same rows): the larger of the two is counted. */
static double qk__blas_ws(qk_gpu_engine e, int cplx, int q, double t, double rows, double cols)
{
    double W = ldexp(cplx ? 2.0 : 1.0, q), c = rows * cols * (cplx ? 2.0 : 1.0) * t, per, four, gauss, mx;
    if (!qk__engine_tc(e)) return c;
    if (e == QK_GPU_TC_FP64) return c + 512.0 + (cplx ? cols * W * 8.0 : 0.0);
    per = e == QK_GPU_TC_FP32X3 ? 8.0 * W : e == QK_GPU_TC_TF32 ? 4.0 * W : 2.0 * W;
    four = c + 512.0 + per * (rows + cols * (cplx ? 2.0 : 1.0));
    if (!cplx) return four;
    mx = rows > cols ? rows : cols;
    gauss = c * 1.5 + 512.0 + per / 2.0 * (4.0 * mx > 3.0 * (rows + cols) ? 4.0 * mx : 3.0 * (rows + cols));
    return gauss > four ? gauss : four;
}

/* Device bytes of the fused tensor-core engine's operands (plan.engine TCF_*, qk_cuda.cu's
   qk__tcf_geometry: keep the two in step) for `rows` states: 32-bit words per state, TF32 one per
   value, FP16 one per two values, FP32X3 two per two values (hi and lo), each part rounded up to
   whole k-stages (32 words; FP32X3 16). */
static double qk__tcf_ws(qk_gpu_engine eng, int cplx, int q, double rows)
{
    const double W = ldexp(cplx ? 2.0 : 1.0, q), kw = 32.0;   /* rows of whole 32-word stages (qk__tcf_geometry) */
    const double words = eng == QK_GPU_TCF_TF32 ? W : ceil(W / 2.0), ldp = ceil(words / kw) * kw;
    return rows * (eng == QK_GPU_TCF_FP32X3 ? 2.0 : 1.0) * ldp * 4.0 + 16.0;
}

/* The VRAM estimator: device bytes per sample of a q-qubit map on a path, in T of t bytes:
   *state, the state itself (analytic: its q qubit 2-vectors), and *scratch, its build scratch
   (params values of the compiled program, 1/||x||, the multi-pass state buffer beyond
   QK__PASS_QUBITS, the sample's n_features doubles on the device). qk__plan_cuda and
   qk_max_samples both count with it. */
static void qk__vram_per_state(int q, int n_features, double params, qk_path path, double t, double *state, double *scratch)
{
    double D = ldexp(1.0, q > 62 ? 62 : q);
    if (path == QK_PATH_ANALYTIC) { *state = 4.0 * q * t; *scratch = 0; return; }
    *state = D * t * (path == QK_PATH_REAL ? 1.0 : 2.0);
    *scratch = params * t + 8.0 /* 1/||x|| */ + (q > QK__PASS_QUBITS ? D * 2.0 * t : 0.0);
    *scratch += (double)n_features * 8.0; /* x on the device */
}

/* Device bytes per state of map m (qk__vram_per_state with its compiled program's params). */
static void qk__cuda_state_bytes(const qk_map *m, qk_path path, size_t t, double *state, double *scratch)
{
    qk__vram_per_state(m->n_qubits, m->n_features, (double)qk__cuda_params(m), path, (double)t, state, scratch);
    if (qk__map_is_states(m))   /* given states: loaded (no pass buffer); device states read in place */
        *scratch = (double)t + 8.0 + ((m->ops[0].q1 & QK__STATE_DEVICE) ? 0.0 : (double)m->n_features * 8.0);
}

/* ---- precision: stated error bounds and the AUTO choice ---- */
QKDEF double qk_precision_error_bound(qk_precision p, int n_qubits)
{
    const double q = n_qubits, u = ldexp(1.0, -11);
    double ep;
    if (n_qubits < 0 || n_qubits > 62) return -1.0;
    switch (p) {
    case QK_PRECISION_FP64: return 1e-10;
    case QK_PRECISION_FP32: ep = 0.0; break;
    case QK_PRECISION_TF32:
    case QK_PRECISION_FP16: ep = 2.0 * u + u * u; break;
    case QK_PRECISION_FP32X3: ep = 3.0 * ldexp(1.0, -22); break;
    default: return -1.0;
    }
    /* the operands' term (docs/precision.md): Gauss's product (the cuBLAS engines, complex
       states) carries e = e_p + 2^-23 (re - im and re + im rounded to fp32 first) on
       Re (<= e) and Im (<= 3e), so |delta| <= sqrt(10) e */
    if (ep > 0.0) ep += ldexp(1.0, -23);
    return 1e-4 * (1.0 + q / 4.0) + ldexp(1.0, n_qubits - 24) / 4.0 + 1e-4 + (ep > 0.0 ? 2.0 * sqrt(10.0) * ep + 10.0 * ep * ep : 0.0);
}

/* Speed order of the GPU modes (docs/precision.md: fp16 > tf32 > fp32x3 > fp32 > fp64 wherever
   the tensor cores apply). A tensor-core mode
   is a candidate only where it runs on the tensor cores (qk__tc_min_qubits .. QK__TC_MAX_QUBITS,
   not the analytic path); elsewhere it would run the fp32 engine, which AUTO then names as is. */
/* The default tolerance of AUTO (tol 0): fp32-class, fp32x3's bound (fp32's plus the hi/lo
   split's operand term, 5.3e-6; its measured error is fp32's, docs/precision.md), so from 7
   qubits the default runs fp32x3 on the tensor cores; product maps (the analytic path: no sum of
   2^q products, no tensor cores) keep fp32's bound without its drift term. */
static double qk__default_tol(int n_qubits, qk_path path)
{
    const int q = n_qubits > 62 ? 62 : n_qubits;
    return path == QK_PATH_ANALYTIC ? qk_precision_error_bound(QK_PRECISION_FP32, q) - ldexp(1.0, q - 24) / 4.0
                                    : qk_precision_error_bound(QK_PRECISION_FP32X3, q);
}

QK__PRIV qk_precision qk__auto_precision(const qk_map *map, qk_path path, double tol, int wgmma, char *note, size_t size)
{
    static const qk_precision order[5] = {QK_PRECISION_FP16, QK_PRECISION_TF32, QK_PRECISION_FP32X3, QK_PRECISION_FP32,
                                          QK_PRECISION_FP64};
    /* product maps (the analytic path) multiply q per-qubit overlaps: no sum of 2^q products, so
       fp32's bound there drops the drift term */
    const int q = map->n_qubits > 62 ? 62 : map->n_qubits, an = path == QK_PATH_ANALYTIC;
    const double drift = ldexp(1.0, q - 24) / 4.0;
    const double t = tol > 0.0 ? tol : qk__default_tol(map->n_qubits, path);
    char g1[32], g2[32];
    int i;
    for (i = 0; i < 5; i++) {
        const qk_precision m = order[i];
        const int tc = m == QK_PRECISION_FP16 || m == QK_PRECISION_TF32 || m == QK_PRECISION_FP32X3;
        const double b = qk_precision_error_bound(m, q) - (an && m == QK_PRECISION_FP32 ? drift : 0.0);
        if (tc && (path == QK_PATH_ANALYTIC || map->n_qubits < qk__tc_min_qubits_on(m, wgmma, path) || map->n_qubits > 24)) continue;
        if (b > t) continue;
        if (note) /* numbers with a '.' whatever the locale (the plan text is locale-free) */
            snprintf(note, size, "auto: %s, the fastest mode whose error bound %s meets tol %s%s (%d qubits)", qk_precision_name(m),
                     qk__fmt_g(g1, sizeof g1, b, 2), qk__fmt_g(g2, sizeof g2, t, 2), tol > 0.0 ? "" : an ? " (default: fp32's bound)" : " (default: fp32-class, fp32x3's bound)",
                     map->n_qubits);
        return m;
    }
    if (note)
        snprintf(note, size, "auto: fp64: no mode's error bound meets tol %s (fp64's is %s)", qk__fmt_g(g1, sizeof g1, t, 2),
                 qk__fmt_g(g2, sizeof g2, qk_precision_error_bound(QK_PRECISION_FP64, q), 2));
    return QK_PRECISION_FP64;
}

/* CPU plan: all states in host memory when they fit the host budget, else state tiles. */
#ifndef QK_CPU_SLAB_BYTES
#define QK_CPU_SLAB_BYTES ((size_t)128 << 20)   /* host bytes per streamed slab (two are used) */
#endif
#define QK__CPU_SLAB_BYTES ((size_t)(QK_CPU_SLAB_BYTES))
#define QK__HOST_SHARE 0.85     /* share of the available host memory the CPU engine plans with */

/* Available host memory in bytes, 0 when unknown: Linux's MemAvailable (free memory and the
   page cache the kernel can drop), bounded by the cgroup v2 limit (memory.max - memory.current)
   where the process runs in one (containers, batch jobs); elsewhere sysconf's available pages. */
static double qk__host_avail(void)
{
    double avail = 0.0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (double)kb * 1024.0; break; }
        fclose(f);
    }
    if (avail > 0) {
        unsigned long long mx = 0, cur = 0;
        int ok = 0;
        f = fopen("/sys/fs/cgroup/memory.max", "r");   /* "max" (no limit) does not scan */
        if (f) { ok = fscanf(f, "%llu", &mx) == 1; fclose(f); }
        f = ok ? fopen("/sys/fs/cgroup/memory.current", "r") : NULL;
        if (f) {
            if (fscanf(f, "%llu", &cur) == 1 && mx > cur && (double)(mx - cur) < avail) avail = (double)(mx - cur);
            fclose(f);
        }
        return avail;
    }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    {
        long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
        if (pages > 0 && ps > 0) return (double)pages * (double)ps;
    }
#endif
    return 0.0;
}

/* Host bytes of the CPU engine's per-thread scratch: the Gram tile buffers of qk__gram_work
   (and a callback tile) and the state builders' angles and, real path, imaginary half. */
static double qk__cpu_scratch(const qk_map *map, qk_path path, double es, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + es * QK__T * QK__T;
    double build = 8.0 * (map->n_ops + 1) + (path == QK_PATH_REAL ? 8.0 * ldexp(1.0, map->n_qubits) : 0.0);
    return (double)(nt > 0 ? nt : 1) * (tile + build);
}

/* The same for qk_max_samples: a complex map of q qubits and a few hundred ops, float64 K. */
static double qk__cpu_scratch_q(int q, int nt)
{
    double tile = 8.0 * ((double)QK__TR * QK__T * 2 + QK__T * QK__T + QK__DC * 2 * QK__NJ + (double)QK__TR * QK__DC * 2) + 8.0 * QK__T * QK__T;
    return (double)(nt > 0 ? nt : 1) * (tile + 8.0 * (20.0 * q + 2.0 * (1 + q + q * q) + 1));
}

#if !defined(_WIN32)
#include <sys/resource.h>
#endif
/* The address space and data segment the process may still map under its resource limits
   (ulimit -v, ulimit -d; batch systems set them): RLIMIT_AS less the current virtual size, and
   RLIMIT_DATA less the current data and stack size (/proc/self/statm, conservatively: its data
   field counts the stack too), the smaller where both are finite; at least 1 byte once a limit
   is reached. -1: no finite limit (or no getrlimit). Where statm cannot be read, the limit
   itself is the room. */
static double qk__rlimit_room(void)
{
    double room = -1.0;
#if !defined(_WIN32) && (defined(RLIMIT_AS) || defined(RLIMIT_DATA))
    struct rlimit rl;
    double vm = 0.0, data = 0.0, page = 4096.0;
    FILE *f;
#if defined(_SC_PAGESIZE)
    {
        long ps = sysconf(_SC_PAGESIZE);
        if (ps > 0) page = (double)ps;
    }
#endif
    f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long long sz, res, sh, txt, lib, dat;
        if (fscanf(f, "%llu %llu %llu %llu %llu %llu", &sz, &res, &sh, &txt, &lib, &dat) == 6) {
            vm = (double)sz * page;
            data = (double)dat * page;
        }
        fclose(f);
    }
#ifdef RLIMIT_AS
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) room = (double)rl.rlim_cur - vm;
#endif
#ifdef RLIMIT_DATA
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (room < 0.0 || (double)rl.rlim_cur - data < room))
        room = (double)rl.rlim_cur - data;
#endif
    if (room != -1.0 && room < 1.0) room = 1.0;
#endif
    return room;
}

/* The host budget of a CPU plan (bytes), and the available memory it came from (0: given). The
   available memory is qk__host_avail's, bounded by what the resource limits leave
   (qk__rlimit_room): under ulimit -v the states are tiled as under a cgroup's limit. */
static double qk__host_budget(const qk_device_info *info, double *avail)
{
    double room;
    *avail = 0.0;
    if (info && info->host_budget_bytes) return (double)info->host_budget_bytes;
    *avail = qk__host_avail();
    room = qk__rlimit_room();
    if (room > 0.0 && (*avail <= 0.0 || room < *avail)) *avail = room;
    return QK__HOST_SHARE * *avail;
}

/* nt: the engine's threads (their scratch is counted). keep (may be NULL): an MPS plan's program
   for the engine (qk__mps_plan). */
QK__PRIV qk_result qk__plan_cpu_nt(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, int nt, qk_plan *p,
                                   qk__mps_prog *keep)
{
    qk_path path = qk__path_of(map);
    const int64_t nb = desc->y ? desc->n_y : desc->n_x;
    double avail, budget, row, es, all, scratch, staging = 0.0;
    qk_result r;
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CPU;
    p->path = path;
    p->precision = QK_PRECISION_FP64;
    p->out_dtype = desc->out_dtype ? desc->out_dtype : (qk__prec_f32(desc->precision) ? QK_F32 : QK_F64);
    p->output = desc->output;
    p->n_qubits = map->n_qubits;
    p->n_x = desc->n_x;
    p->n_y = nb;
    p->symmetric = desc->y == NULL;
    p->n_threads = nt > 0 ? nt : 1;
    p->bulk_states = 1;
    p->state_tile = 0;
    p->tile_m = p->tile_n = QK__T;
    p->n_streams = 0;
    p->linear = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_MIXED) != 0;
    es = p->out_dtype == QK_F32 ? 4.0 : 8.0;
    p->bytes_states = map->n_qubits > QK_MAX_STATE_QUBITS && path != QK_PATH_ANALYTIC ? (size_t)-1 /* no statevector */
                      : (size_t)((double)(desc->n_x + (desc->y ? desc->n_y : 0)) * (double)qk__row_len(map, path) * 8.0);
    p->bytes_out = (size_t)((double)desc->n_x * (double)nb * es);
    p->bytes_total = p->bytes_states;
    if (desc->output == QK_OUTPUT_NPY) {
        /* two slab buffers of at most cpu_slab_bytes (QK_CPU_SLAB_BYTES) each, whole tiles of
           rows: host memory O(slab), not O(n^2); the symmetric mirror goes out as one write per
           row and slab, so taller slabs mean fewer, larger writes */
        double rb = (double)nb * es;
        size_t slab_bytes = desc->cpu_slab_bytes ? desc->cpu_slab_bytes : QK__CPU_SLAB_BYTES;
        int64_t sr = (int64_t)((double)slab_bytes / rb) / QK__T * QK__T;
        if (sr < QK__T) sr = QK__T;
        if (sr > desc->n_x) sr = (desc->n_x + QK__T - 1) / QK__T * QK__T;
        p->slab_rows = sr;
        p->bytes_staging = (size_t)(2.0 * (double)sr * rb);
        staging = (double)p->bytes_staging + (double)sr * 64.0 * es; /* and the strips' buffer */
    }
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d; fp64 arithmetic (asked %s: the CPU engine computes in fp64)",
                 QK__T, QK__T, QK__NI, QK__NJ, qk_precision_name(desc->precision));
    else snprintf(p->config, sizeof p->config, "cpu tile %dx%d micro %dx%d", QK__T, QK__T, QK__NI, QK__NJ);
    p->error_bound = qk_precision_error_bound(QK_PRECISION_FP64, map->n_qubits);
    p->tol = desc->precision == QK_PRECISION_AUTO ? desc->tol : 0.0;
    if (desc->precision && desc->precision != QK_PRECISION_FP64)
        snprintf(p->precision_note, sizeof p->precision_note, "fp64 (asked %s: the CPU engine accepts every mode and computes in fp64%s)",
                 qk_precision_name(desc->precision), desc->precision == QK_PRECISION_AUTO ? ", which meets any tolerance" : "");
    snprintf(p->device_name, sizeof p->device_name, "CPU");
    budget = qk__host_budget(info, &avail);
    p->bytes_budget = (size_t)budget;
    p->bytes_host_avail = (size_t)avail;
    r = qk__mps_plan(map, desc, p, keep);   /* MPS engine: statevector or MPS */
    if (r != QK_OK || p->path == QK_PATH_MPS) return r;

    /* statevector and analytic paths: all states resident when they fit the host budget with
       the scratch and the streamed output's slabs; else state tiles, two blocks of R samples
       (R a multiple of the tile side from QK__T on), and the streamed output's slabs one row
       block each. An unknown budget (no /proc/meminfo, no sysconf) plans all resident. */
    row = (double)qk__row_len(map, path) * 8.0;
    all = (double)p->bytes_states;
    scratch = qk__cpu_scratch(map, path, es, p->n_threads);
    p->bytes_workspace = (size_t)scratch;
    p->bytes_total = (size_t)(all + scratch + (double)p->bytes_staging);
    if (budget <= 0 || all + scratch + staging <= budget) return QK_OK;
    {
        const double per = 2.0 * row + (desc->output == QK_OUTPUT_NPY ? 2.0 * (double)nb * es + 64.0 * es : 0.0);
        const int64_t most = desc->n_x > nb ? desc->n_x : nb;
        double fit;
        /* fewer threads where their scratch leaves no room for two states (a small budget on a
           host of many cores): each thread's scratch is its own */
        while (p->n_threads > 1 && (budget - scratch) / per < 1.0) {
            p->n_threads = (p->n_threads + 1) / 2;
            scratch = qk__cpu_scratch(map, path, es, p->n_threads);
            p->bytes_workspace = (size_t)scratch;
        }
        fit = (budget - scratch) / per;
        int64_t R = fit >= (double)most ? most : fit >= 1.0 ? (int64_t)fit : 0;
        if (R < 1)
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "plan: two %d-qubit states need %.0f bytes of host memory (%.3g GB, with %.0f bytes "
                            "of scratch for %d threads), the host budget is %.0f bytes (%.3g GB%s)", map->n_qubits,
                            per + scratch, (per + scratch) * 1e-9, scratch, p->n_threads, budget, budget * 1e-9,
                            avail > 0 ? ": 85% of the available memory" : ": qk_ctx_desc.host_memory");
        if (R > QK__T) R = R / QK__T * QK__T;
        p->bulk_states = 0;
        p->state_tile = R;
        p->tile_m = p->tile_n = R < QK__T ? R : QK__T;
        p->bytes_states = (size_t)(2.0 * (double)R * row);
        if (desc->output == QK_OUTPUT_NPY) {
            p->slab_rows = R;
            p->bytes_staging = (size_t)(2.0 * (double)R * (double)nb * es);
        }
        p->bytes_total = (size_t)((double)p->bytes_states + scratch + (double)p->bytes_staging);
    }
    return QK_OK;
}

static qk_result qk__plan_cpu(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep)
{
    return qk__plan_cpu_nt(info, map, desc, qk__ncores(), p, keep);
}



static qk_result qk__plan_cuda(const qk_device_info *info, double vram_fraction, const qk_map *map,
                               const qk_gram_desc *desc, qk_plan *p)
{
    const qk_path path = qk__path_of(map);
    const int sym = desc->y == NULL;
    const int64_t nx = desc->n_x, ny = sym ? desc->n_x : desc->n_y;
    char note[128] = "";
    /* density matrices (qk_gram_states, a_mixed / b_mixed): K = a . b itself (plan.linear), on the
       cuBLAS real engine, whose epilogue keeps the inner product unsquared (docs/states.md) */
    const int linear = qk__map_is_states(map) && (map->ops[0].q1 & QK__STATE_MIXED) != 0;
    /* (the wgmma kernel's few-qubit fp32x3 squares: not for the linear epilogue) */
    const qk_precision prec = desc->precision && desc->precision != QK_PRECISION_AUTO
                                  ? desc->precision : qk__auto_precision(map, path, desc->tol, info->wgmma && !linear, note, sizeof note);
    const size_t t = prec == QK_PRECISION_FP64 ? 8 : 4;
    const qk_dtype od = desc->out_dtype ? desc->out_dtype : (prec == QK_PRECISION_FP64 ? QK_F64 : QK_F32);
    const double ob = od == QK_F64 ? 8.0 : 4.0;
    const double budget = (vram_fraction > 0 ? vram_fraction : 0.85) * (double)info->free_bytes;
    double st, sc, es, need;
    int64_t slab, tile;
    int tc_fallback = 0, slab_tile = 0;
    memset(p, 0, sizeof *p);
    p->backend = QK_BACKEND_CUDA;
    p->linear = linear;
    p->path = path;
    p->precision = prec;
    {   /* the analytic path has no sum of 2^q products: fp32's bound without the drift term */
        const double drift = path == QK_PATH_ANALYTIC ? ldexp(1.0, (map->n_qubits > 62 ? 62 : map->n_qubits) - 24) / 4.0 : 0.0;
        p->error_bound = qk_precision_error_bound(prec, map->n_qubits > 62 ? 62 : map->n_qubits) - (prec == QK_PRECISION_FP64 ? 0.0 : drift);
        p->tol = desc->precision == QK_PRECISION_AUTO || desc->precision == QK_PRECISION_DEFAULT
                     ? (desc->tol > 0.0 ? desc->tol : qk__default_tol(map->n_qubits, path))
                     : 0.0;
    }
    snprintf(p->precision_note, sizeof p->precision_note, "%s", note);
    qk__plan_job_fields(p, map, desc, od, nx, ny, sym);
    p->bytes_budget = (size_t)budget;
    snprintf(p->device_name, sizeof p->device_name, "%s", info->name);
    if (path != QK_PATH_ANALYTIC && map->n_qubits > QK_MAX_STATE_QUBITS)
        return qk__fail(QK_ERROR_TOO_MANY_QUBITS, "plan: %d qubits exceed the state limit %d", map->n_qubits, QK_MAX_STATE_QUBITS);
    qk__cuda_state_bytes(map, path, t, &st, &sc);
    p->engine = path != QK_PATH_ANALYTIC && map->n_qubits >= QK__BLAS_MIN_QUBITS ? QK_GPU_CUBLAS : QK_GPU_FUSED;
    if (linear) {
        /* the cuBLAS real engine, or its tensor-core form (the real Gram of the vectorised
           matrices, one GEMM a block: qk__tc_products) where the mode runs on the tensor cores;
           never the fused kernels, whose epilogues square */
        p->engine = qk__tc_mode(prec) && map->n_qubits >= qk__tc_min_qubits(prec) && map->n_qubits <= QK__TC_MAX_QUBITS
                        ? qk__tc_mode(prec) : QK_GPU_CUBLAS;
        if (qk__tc_mode(prec) && p->engine == QK_GPU_CUBLAS) tc_fallback = map->n_qubits > QK__TC_MAX_QUBITS ? 2 : 3;
    } else if (qk__tc_mode(prec) && path != QK_PATH_ANALYTIC) {
        p->engine = map->n_qubits < qk__tc_min_qubits_on(prec, info->wgmma, path) ? QK_GPU_FUSED
                    : map->n_qubits <= QK__TC_MAX_QUBITS ? qk__tc_mode(prec) : QK_GPU_CUBLAS;
        if (p->engine == QK_GPU_CUBLAS) tc_fallback = 2;
    }
    es = (path == QK_PATH_COMPLEX ? 2.0 : 1.0) * (double)t; /* one <a|b> in the cuBLAS workspace */

    /* states: bulk when all of them (and their scratch) take at most half the budget */
    need = (double)(nx + (sym ? 0 : ny)) * st + (double)(nx > ny ? nx : ny) * sc;
    if (qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && !sym)   /* both sides' rows on the device */
        need += (double)(nx < ny ? nx : ny) * (double)map->n_features * 8.0;
    if (need <= 0.5 * budget) {
        p->bulk_states = 1;
        p->state_tile = 0;
        tile = nx > ny ? nx : ny;
        p->bytes_states = (size_t)need;
    } else {
        /* two tiles (A and B) with scratch in half the budget, a power of two. Given host states
           (the data are the states, copied in by tile): a slab of K is a whole tile of rows, so
           that the column tiles cross PCIe once per tile of rows, n + n^2 / 2R rows for K(A,A),
           not once per slab; the ring of two such slabs of K is then counted with the tiles
           (unless even 64 rows of it do not fit: then slabs as for maps) */
        double ring = qk__map_is_states(map) && !(map->ops[0].q1 & QK__STATE_DEVICE) && desc->output != QK_OUTPUT_DEVICE
                          ? 2.0 * (double)ny * ob : 0.0;
        if (64.0 * (2.0 * st + sc + ring) > 0.5 * budget) ring = 0.0;
        slab_tile = ring > 0.0;
        tile = 1;
        while (tile * 2 <= (nx > ny ? nx : ny) && (double)(tile * 2) * (2.0 * st + sc + ring) <= 0.5 * budget) tile *= 2;
        if ((double)tile * (2.0 * st + sc) > 0.5 * budget)
            return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: one %d-qubit state (%.3g GB with scratch) exceeds the device budget %.3g GB",
                            map->n_qubits, (2.0 * st + sc) * 1e-9, budget * 1e-9);
        p->bulk_states = 0;
        p->state_tile = tile;
        p->bytes_states = (size_t)((double)tile * (2.0 * st + sc));
    }

    /* slabs: rows of K per step. Device output: one step (the fused kernel) or as many rows as
       a quarter of the budget holds in cuBLAS workspace. Host outputs: ~64 MB of K per slab, so
       the D2H of one overlaps the compute of the next and the host-side delivery of the one
       before; small pinned staging slabs keep
       the cost of pinning them small (docs/benchmarks.md, 'Figures behind the code's constants'). */
    if (desc->output == QK_OUTPUT_DEVICE) {
        /* one slab: slabbing K for device output bought nothing (docs/benchmarks.md, 'Figures behind the code's constants') */
        slab = nx;
    } else {
        slab = (int64_t)(64.0 * 1048576.0 / ((double)ny * ob));
        /* and at most ~25 ms of compute per slab (FP32 cores at ~50 TFLOP/s, 8 D flops per
           complex pair, 2 D per real pair), so that a cancel (progress callback, Ctrl-C in
           Python, SIGINT in qk-gram) lands within a few slabs (docs/benchmarks.md, 'Figures behind the code's constants') */
        if (path != QK_PATH_ANALYTIC) {
            double per_pair = (path == QK_PATH_COMPLEX ? 8.0 : 2.0) * ldexp(1.0, map->n_qubits > 62 ? 62 : map->n_qubits);
            double cap = 25e-3 * 50e12 / (per_pair * (double)ny);
            if ((double)slab > cap) slab = (int64_t)cap;
        }
        if (slab < 64) slab = 64;
        if (slab > nx) slab = nx;
    }
    if (!p->bulk_states && (slab > tile || slab_tile)) slab = tile;
    if (qk__engine_tc(p->engine)) {
        /* tensor-core operands: as many rows as fit QK__TC_WS_SHARE of the budget (a ring of two
           slots when there are several slabs); when even 64 rows do not (the columns' operands
           alone), the fp32 cuBLAS engine, more accurate and without operand copies */
        const int cx = path == QK_PATH_COMPLEX, q = map->n_qubits;
        int64_t cols = p->bulk_states ? ny : tile, s2 = slab;
        /* (given host states in tiles keep slabs of a whole tile: a smaller slab would fetch
           the column tiles again for each slab, so the fp32 cuBLAS engine runs instead) */
        while (!slab_tile && s2 > 64 && (s2 < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)s2, (double)cols) > QK__TC_WS_SHARE * budget)
            s2 = (s2 + 1) / 2;
        if ((s2 < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)s2, (double)cols) > QK__TC_WS_SHARE * budget) {
            tc_fallback = 1;
            p->engine = QK_GPU_CUBLAS;
        } else {
            slab = s2;
            p->bytes_workspace = (size_t)((slab < nx ? 2.0 : 1.0) * qk__blas_ws(p->engine, cx, q, (double)t, (double)slab, (double)cols));
        }
    }
    if (!linear && qk__engine_tcf_of(p->engine) != QK_GPU_FUSED && map->n_qubits <= qk__tcf_max_qubits(p->precision, info->wgmma)) {
        /* the fused tensor-core kernel (fixed table; the autotune times both): its operands, every
           state once (bulk) or two state tiles, must fit where the cuBLAS engine's did; the larger
           of the two workspaces is counted, so the autotune may pick either */
        const double fw = qk__tcf_ws(qk__engine_tcf_of(p->engine), path == QK_PATH_COMPLEX, map->n_qubits,
                                     p->bulk_states ? (double)(nx + (sym ? 0 : ny)) : 2.0 * (double)tile);
        if (fw <= QK__TC_WS_SHARE * budget) {
            p->engine = qk__engine_tcf_of(p->engine);
            p->kernel_cfg = qk__tcf_fixed_cfg(map->n_qubits, prec, info->wgmma);
            if (fw > (double)p->bytes_workspace) p->bytes_workspace = (size_t)fw;
        }
    }
    if (p->engine == QK_GPU_CUBLAS || p->engine == QK_GPU_CUBLAS_3M) {
        int64_t cols = p->bulk_states ? ny : tile;
        while (slab > 64 && !slab_tile && 2.0 * (double)slab * (double)cols * es > 0.25 * budget) slab = (slab + 1) / 2;
        p->bytes_workspace = (size_t)((slab < nx ? 2.0 : 1.0) * (double)slab * (double)cols * es);
    }
    p->tile_m = slab;
    p->tile_n = p->bulk_states ? ny : tile;
    p->slab_rows = desc->output == QK_OUTPUT_DEVICE ? 0 : slab;

    /* K on the device (host/callback outputs) */
    if (desc->output != QK_OUTPUT_DEVICE) {
        double left = budget - (double)p->bytes_states - (double)p->bytes_workspace;
        double full = (double)nx * (double)ny * ob;
        p->k_resident = full <= left;
        p->bytes_out = (size_t)(p->k_resident ? full : 2.0 * (double)slab * (double)ny * ob);
        p->bytes_staging = (size_t)(2.0 * (double)slab * (double)ny * ob);
    }
    p->bytes_total = p->bytes_states + p->bytes_out + p->bytes_workspace;
    p->use_blas = (int)p->engine;   /* the deprecated mirror */
    if (!qk__blas_ok(prec, path, p->engine)) /* the engine is never less accurate than asked */
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "plan: engine %s does not serve precision %s", qk__engine_name(p->engine), qk_precision_name(prec));
    if ((double)p->bytes_total > budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: needs %.3g GB of device memory, budget %.3g GB",
                        (double)p->bytes_total * 1e-9, budget * 1e-9);
    if (path == QK_PATH_ANALYTIC) snprintf(p->config, sizeof p->config, "analytic 64x64 t4x4 (fixed table)");
    else if (linear && qk__engine_tc(p->engine))
        snprintf(p->config, sizeof p->config, "cublas %s tensor cores, real form, %s, linear epilogue: Tr(rho_i rho_j)",
                 qk_precision_name(prec), sym ? "triangle blocks" : "gemm");
    else if (linear) {   /* (at most 95 characters: "...) (fp32x3: no tensor cores, < 7 qubits)") */
        char why[24] = "workspace";
        if (tc_fallback == 3) snprintf(why, sizeof why, "< %d qubits", qk__tc_min_qubits(prec));
        if (tc_fallback == 2) snprintf(why, sizeof why, "> %d qubits", QK__TC_MAX_QUBITS);
        /* the precisions bound so that GCC's -Wformat-truncation (-O1, -Os) sees the 96 bytes suffice */
        snprintf(p->config, sizeof p->config, "cublas %s %s, linear epilogue: Tr(rho_i rho_j)%s%.7s%s%.11s%s",
                 prec == QK_PRECISION_FP64 ? "fp64" : "fp32", sym ? "syrk+gemm" : "gemm", tc_fallback ? " (" : "",
                 tc_fallback ? qk_precision_name(prec) : "", tc_fallback ? ": no tensor cores, " : "", tc_fallback ? why : "",
                 tc_fallback ? ")" : "");
    }
    else if (qk__engine_tcf(p->engine))
        snprintf(p->config, sizeof p->config, "fused %s tensor cores (%s) %s, |.|^2 in the epilogue (fixed table)",
                 qk_precision_name(prec), p->kernel_cfg == 4 ? "wgmma" : "mma.sync",
                 p->kernel_cfg == 4 ? (prec == QK_PRECISION_FP32X3 ? "128x64" : "128x128")
                 : prec == QK_PRECISION_FP32X3 || p->kernel_cfg == 2 ? "64x64 w32x32" : "128x128 w64x32");
    else if (qk__engine_tc(p->engine))
        snprintf(p->config, sizeof p->config, "cublas %s tensor cores, real form, %s + |.|^2 epilogue (fixed table)",
                 qk_precision_name(prec), sym ? "triangle blocks" : "gemm");
    else if (tc_fallback)
        snprintf(p->config, sizeof p->config, "cublas fp32 %s (%s %s) (fixed table)", sym ? "herk/syrk+gemm" : "gemm",
                 qk_precision_name(prec), tc_fallback == 2 ? "tensor cores: at most 24 qubits" : "operands exceed the budget");
    else if (p->engine != QK_GPU_FUSED) snprintf(p->config, sizeof p->config, "cublas %s + |.|^2 epilogue (fixed table)", sym ? "herk/syrk+gemm" : "gemm");
    else if (qk__tc_mode(prec) && path != QK_PATH_ANALYTIC)
        snprintf(p->config, sizeof p->config, "fused %s fp32 (%s: tensor cores do not pay below %d qubits) (fixed table)",
                 qk__fused_cfg_name(qk__fused_cfg_fixed(map->n_qubits, 0, path != QK_PATH_REAL, od == QK_F32)),
                 qk_precision_name(prec), qk__tc_min_qubits_on(prec, info->wgmma, path));
    else snprintf(p->config, sizeof p->config, "fused %s (fixed table)",
                  qk__fused_cfg_name(qk__fused_cfg_fixed(map->n_qubits, prec == QK_PRECISION_FP64, path != QK_PATH_REAL, od == QK_F32)));
    p->kernel_cfg = qk__plan_cfg_runs(p, p->engine, p->kernel_cfg);   /* the fixed table's configuration, named */
    return QK_OK;
}

static qk_result qk__plan_for_device(const qk_device_info *info, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);

/* A plan's device fields for one device (or the CPU engine: n_devices 0). */
static void qk__plan_one_device(qk_plan *p, int ordinal)
{
    memset(p->devices, 0, sizeof p->devices);
    memset(p->dev_row0, 0, sizeof p->dev_row0);
    memset(p->dev_pairs, 0, sizeof p->dev_pairs);
    p->n_devices = p->backend == QK_BACKEND_CUDA ? 1 : 0;
    p->devices[0] = ordinal;
    p->dev_row0[1] = p->n_x;
    p->dev_pairs[0] = p->symmetric ? p->n_x * (p->n_x + 1) / 2 : p->n_x * p->n_y;
    p->dev_imbalance = 1.0;
    p->dev_full_rows = 0;
    p->n_parts = 0;
}

QKDEF qk_result qk_plan_for_device(const qk_device_info *info, double vram_fraction,
                                   const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    qk_result r = qk__plan_for_device(info, vram_fraction, map, desc, out, NULL);
    if (r == QK_OK) qk__plan_one_device(out, 0);
    return r;
}

#ifndef QK_MGPU_MIN_PAIRS
#define QK_MGPU_MIN_PAIRS ((int64_t)1 << 25)
#endif
/* Full rows (qk_plan.dev_full_rows) below this many flops per byte of K: a GPU does ~50e12
   flops/s (FP32 cores), a host thread transposes and writes ~5e9 bytes/s, so the mirror costs
   more than recomputing when a pair's flops / its bytes < 1e4. */
#define QK__MGPU_FULL_ROWS_FLOPS 1e4
#ifndef QK_MGPU_HOST_BOUND_SPLIT
#define QK_MGPU_HOST_BOUND_SPLIT 0
#endif

/* A rectangle whose mirror its GPU delivers to the host (qk_cuda_io.mirror_out / mrows): one
   slab's transpose more on the device, and each staging slot holds a slab and its transpose.
   Where the transposed slab leaves the budget, K stops being resident (the ring of two slabs);
   a plan that still does not fit fails as any other. */
static qk_result qk__plan_mirror_slab(qk_plan *sp)
{
    const double ob = sp->out_dtype == QK_F64 ? 8.0 : 4.0, slab = (double)sp->slab_rows * (double)sp->n_y * ob;
    if (sp->k_resident && (double)sp->bytes_total + slab > (double)sp->bytes_budget) {
        sp->bytes_total -= sp->bytes_out;
        sp->bytes_out = (size_t)(2.0 * slab);
        sp->bytes_total += sp->bytes_out;
        sp->k_resident = 0;
    }
    sp->bytes_out += (size_t)slab;
    sp->bytes_total += (size_t)slab;
    sp->bytes_staging = (size_t)(4.0 * slab);
    if (sp->bytes_total > sp->bytes_budget)
        return qk__fail(QK_ERROR_DEVICE_OUT_OF_MEMORY, "plan: needs %.3g GB of device memory with the transpose of a slab of the "
                        "rectangle's mirror, budget %.3g GB", (double)sp->bytes_total * 1e-9, (double)sp->bytes_budget * 1e-9);
    return QK_OK;
}

/* qk_plan_for_devices; keep (may be NULL): an MPS plan's program for the engine (the caller frees
   it; zeroed when the plan is not on the MPS path). */
QK__PRIV qk_result qk__plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                      const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    qk_schedule_desc sd;
    qk_schedule sch;
    double w[QK_MAX_DEVICES];
    int k, use, same = 1, full;
    int64_t total, minp;
    int split;
    qk_result r;
    if (!infos || !map || !desc || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: NULL argument");
    /* the tunables: the desc's, else the macros' (qk_gram_desc.mgpu_min_pairs, mgpu_host_bound_split) */
    minp = desc->mgpu_min_pairs > 0 ? desc->mgpu_min_pairs : (int64_t)(QK_MGPU_MIN_PAIRS);
    if (minp < 1) minp = 1;
    split = desc->mgpu_host_bound_split ? desc->mgpu_host_bound_split > 0 : (QK_MGPU_HOST_BOUND_SPLIT) != 0;
#if defined(QK_CUDA) && QK_CUDA
    /* a page-locked HOST buffer takes each GPU's rows straight over its own link (no host copy):
       a host-bound K(X,X) is dealt out unless the desc says -1 (docs/api.md, "Several GPUs") */
    if (desc->mgpu_host_bound_split == 0 && desc->output == QK_OUTPUT_HOST && desc->out && qk_cuda_host_pinned(desc->out)) split = 1;
#endif
    if (n < 1 || n > QK_MAX_DEVICES) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: n must be in [1, %d] (got %d)", QK_MAX_DEVICES, n);
    for (k = 0; k < n; k++) {
        int j;
        if (!infos[k].present) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: infos[%d] is not a present device", k);
        if (ordinals && ordinals[k] < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: ordinals[%d] = %d", k, ordinals[k]);
        for (j = 0; ordinals && j < k; j++)
            if (ordinals[j] == ordinals[k]) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_devices: CUDA device %d is listed twice", ordinals[k]);
    }
    r = qk__plan_for_device(&infos[0], vram_fraction, map, desc, out, keep);
    if (r != QK_OK) return r;
    qk__plan_one_device(out, 0);
    if (out->backend != QK_BACKEND_CUDA) { out->n_devices = 0; return QK_OK; }   /* the CPU engine */
    out->devices[0] = ordinals ? ordinals[0] : 0;
    if (out->path == QK_PATH_MPS) return QK_OK;   /* the MPS path runs on the first GPU alone */
    total = out->dev_pairs[0];
    full = desc->y == NULL && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY) &&
           (out->path == QK_PATH_ANALYTIC ? 0.0 : (out->path == QK_PATH_COMPLEX ? 8.0 : 2.0) * ldexp(1.0, out->n_qubits)) <
           QK__MGPU_FULL_ROWS_FLOPS * (out->out_dtype == QK_F64 ? 8.0 : 4.0);
    for (use = n; use > 1 && total / use < minp; use--) {}
    if (use < 2 || (full && !split)) return QK_OK;   /* the host binds: one GPU */
    for (k = 0; k < use; k++) {
        w[k] = infos[k].sm_count > 0 ? (double)infos[k].sm_count : 1.0;
        if (w[k] != w[0]) same = 0;
    }
    memset(&sd, 0, sizeof sd);
    sd.n_x = desc->n_x;
    sd.n_y = desc->y ? desc->n_y : full ? desc->n_x : 0;
    sd.n_workers = use;
    sd.weights = same ? NULL : w;
    r = qk_schedule_make(&sd, &sch);
    if (r != QK_OK) return r;
    out->n_devices = use;
    out->dev_full_rows = full;
    for (k = 0; k < use; k++) {
        out->devices[k] = ordinals ? ordinals[k] : k;
        out->dev_row0[k] = sch.row0[k];
        out->dev_pairs[k] = sch.pairs[k];
    }
    out->dev_row0[use] = sch.row0[use];
    out->dev_imbalance = sch.imbalance;
    qk_schedule_free(&sch);
    /* every GPU's parts, each planned for that GPU (the engine runs these plans) */
    for (k = 0; k < use; k++) {
        int64_t part[2][3];
        const int np = qk__mgpu_parts(out, k, part);
        qk_map pm;
        qk_op pop;
        int i;
        for (i = 0; i < np; i++) {
            qk_plan_part *pp = &out->parts[out->n_parts];
            qk_gram_desc sd;
            qk_plan sp;
            memset(pp, 0, sizeof *pp);
            pp->device = k;
            pp->symmetric = (int)part[i][2];
            pp->mirror = out->symmetric && !pp->symmetric && !out->dev_full_rows;
            pp->row0 = out->dev_row0[k];
            pp->n_rows = out->dev_row0[k + 1] - out->dev_row0[k];
            pp->col0 = part[i][0];
            pp->n_cols = part[i][1] - part[i][0];
            qk__mgpu_part_desc(out, pp, map->n_features, desc, &sd);
            r = qk__plan_for_device(&infos[k], vram_fraction, qk__map_for_device(map, k, &pm, &pop), &sd, &sp, NULL);
            if (r == QK_OK && pp->mirror && (desc->output == QK_OUTPUT_HOST || desc->output == QK_OUTPUT_NPY)) r = qk__plan_mirror_slab(&sp);
            if (r == QK_OK) qk__plan_one_device(&sp, 0);
            if (r == QK_OK) r = qk__plan_part_set(out, out->n_parts, &sp, infos[k].name);
            if (r != QK_OK) {
                char why[sizeof qk__errbuf];
                snprintf(why, sizeof why, "%s", qk_last_error());
                return qk__fail(r, "CUDA device %d: its part of K (rows [%lld, %lld), columns [%lld, %lld)): %s", out->devices[k],
                                (long long)pp->row0, (long long)(pp->row0 + pp->n_rows), (long long)pp->col0,
                                (long long)(pp->col0 + pp->n_cols), why);
            }
            out->n_parts++;
        }
    }
    return qk__mgpu_check_parts(out);   /* what the engine accepts (it checks again: a plan may be put together by hand) */
}

QKDEF qk_result qk_plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out)
{
    return qk__plan_for_devices(infos, ordinals, n, vram_fraction, map, desc, out, NULL);
}

/* The map GPU k of a plan of several devices plans and runs its parts with: the map itself, but
   for device states (QK__STATE_DEVICE, which live on the first GPU) on any other GPU, a copy
   (*tmp, its op *op) marked QK__STATE_PEER instead: that GPU copies the rows in from the first
   GPU's memory by tile as it would host states (and the planner counts the raw rows' buffer),
   where the first GPU reads them in place. */
QK__PRIV const qk_map *qk__map_for_device(const qk_map *map, int k, qk_map *tmp, qk_op *op)
{
    if (k == 0 || !qk__map_is_states(map) || !(map->ops[0].q1 & QK__STATE_DEVICE)) return map;
    *tmp = *map;
    *op = map->ops[0];
    op->q1 = (op->q1 & ~QK__STATE_DEVICE) | QK__STATE_PEER;
    tmp->ops = op;
    return tmp;
}

/* Device k's parts of K in a plan of several devices: rows [dev_row0[k], dev_row0[k + 1]) and
   columns [part[p][0], part[p][1]) for each part p returned, part[p][2] = 1 for a symmetric
   part (the rows' states its columns' first ones): K(X,Y) and full rows one part (all columns);
   K(X,X) into device buffers or a callback (no rectangle's mirror to deliver) one symmetric part
   from the diagonal to n, its band of a job over X[a:] (qk_cuda_io.band_rows: the diagonal
   block a triangle and its mirror, the rectangle right of it without one, one state build and
   set-up); K(X,X) into host memory or a file the diagonal block and, unless the band ends at n,
   the rectangle right of it (whose mirror the device writes too). */
QK__PRIV int qk__mgpu_parts(const qk_plan *plan, int k, int64_t part[2][3])
{
    const int64_t a = plan->dev_row0[k], b = plan->dev_row0[k + 1];
    int n = 0;
    if (b <= a) return 0;
    if (!plan->symmetric || plan->dev_full_rows) { part[0][0] = 0; part[0][1] = plan->n_y; part[0][2] = 0; return 1; }
    if (plan->output == QK_OUTPUT_DEVICE || plan->output == QK_OUTPUT_CALLBACK) {
        part[0][0] = a; part[0][1] = plan->n_x; part[0][2] = 1;
        return 1;
    }
    part[n][0] = a; part[n][1] = b; part[n][2] = 1; n++;
    if (b < plan->n_x) { part[n][0] = b; part[n][1] = plan->n_x; part[n][2] = 0; n++; }
    return n;
}

/* The job of part pp of a plan of several devices as its GPU runs it (the planner plans it with
   this desc, the engine runs it with this desc and its output added): X's rows of the band, Y's
   columns of the part; a symmetric part (y NULL) the job over X's rows of its columns, of which
   the engine delivers the first n_rows (qk_cuda_io.band_rows where n_cols > n_rows); the
   precision and out_dtype the whole plan resolved. d: features per sample. Planning reads no
   sample, so x may be NULL there. */
QK__PRIV void qk__mgpu_part_desc(const qk_plan *plan, const qk_plan_part *pp, int d, const qk_gram_desc *desc, qk_gram_desc *sd)
{
    static const double none[1] = {0.0};   /* a rectangle's y when the planner got no data */
    const double *Y = desc->y ? desc->y : desc->x;
    memset(sd, 0, sizeof *sd);
    sd->x = desc->x ? desc->x + pp->row0 * d : NULL;
    sd->n_x = pp->symmetric ? pp->n_cols : pp->n_rows;
    sd->y = pp->symmetric ? NULL : Y ? Y + pp->col0 * d : none;
    sd->n_y = pp->symmetric ? 0 : pp->n_cols;
    sd->precision = plan->precision;
    sd->out_dtype = plan->out_dtype;
    sd->path = desc->path;
    sd->output = desc->output;
}

/* The plan part i of a plan of several devices runs (what qk_plan_for_device made for its job on
   its GPU, autotuned by qk_plan_make): the part's fields over the whole plan's shared ones.
   device_name: that GPU's (qk_device_info.name; NULL: none). */
QK__PRIV void qk__plan_part_plan(const qk_plan *plan, int i, const char *device_name, qk_plan *sp)
{
    const qk_plan_part *pp = &plan->parts[i];
    memset(sp, 0, sizeof *sp);
    sp->backend = QK_BACKEND_CUDA;
    sp->path = plan->path;
    sp->precision = plan->precision;
    sp->error_bound = plan->error_bound;
    sp->linear = plan->linear;
    sp->out_dtype = plan->out_dtype;
    sp->output = plan->output;
    sp->n_qubits = plan->n_qubits;
    sp->n_x = pp->symmetric ? pp->n_cols : pp->n_rows;   /* a symmetric part: the job over its columns (a band of its rows) */
    sp->n_y = pp->n_cols;
    sp->symmetric = pp->symmetric;
    sp->bulk_states = pp->bulk_states;
    sp->state_tile = pp->state_tile;
    sp->tile_m = pp->tile_m;
    sp->tile_n = pp->tile_n;
    sp->n_streams = pp->n_streams;
    sp->slab_rows = pp->slab_rows;
    sp->host_pinned = pp->host_pinned;
    sp->bytes_states = pp->bytes_states;
    sp->bytes_out = pp->bytes_out;
    sp->bytes_staging = pp->bytes_staging;
    sp->bytes_workspace = pp->bytes_workspace;
    sp->bytes_total = pp->bytes_total;
    sp->bytes_budget = pp->bytes_budget;
    sp->k_resident = pp->k_resident;
    sp->engine = pp->engine;
    sp->use_blas = (int)pp->engine;
    sp->kernel_cfg = pp->kernel_cfg;
    memcpy(sp->config, pp->config, sizeof sp->config);
    if (device_name) snprintf(sp->device_name, sizeof sp->device_name, "%s", device_name);
    qk__plan_one_device(sp, 0);
}

/* Stores the plan sp of part i (its geometry already in plan->parts[i]) and checks that the part
   carries all of it: qk__plan_part_plan gives sp back byte for byte (device_name: the GPU's),
   so what runs is what was planned; else QK_ERROR_UNSUPPORTED (a part planned on another path,
   another engine family or precision than the whole job: an internal error). */
QK__PRIV qk_result qk__plan_part_set(qk_plan *plan, int i, const qk_plan *sp, const char *device_name)
{
    qk_plan_part *pp = &plan->parts[i];
    qk_plan back;
    if (sp->backend != QK_BACKEND_CUDA || sp->path == QK_PATH_MPS)
        return qk__fail(QK_ERROR_UNSUPPORTED, "the part was planned on the %s (internal error)",
                        sp->backend != QK_BACKEND_CUDA ? "CPU engine" : "MPS path");
    pp->bulk_states = sp->bulk_states;
    pp->state_tile = sp->state_tile;
    pp->tile_m = sp->tile_m;
    pp->tile_n = sp->tile_n;
    pp->n_streams = sp->n_streams;
    pp->slab_rows = sp->slab_rows;
    pp->host_pinned = sp->host_pinned;
    pp->bytes_states = sp->bytes_states;
    pp->bytes_out = sp->bytes_out;
    pp->bytes_staging = sp->bytes_staging;
    pp->bytes_workspace = sp->bytes_workspace;
    pp->bytes_total = sp->bytes_total;
    pp->bytes_budget = sp->bytes_budget;
    pp->k_resident = sp->k_resident;
    pp->engine = sp->engine;
    pp->kernel_cfg = sp->kernel_cfg;
    memcpy(pp->config, sp->config, sizeof pp->config);
    qk__plan_part_plan(plan, i, device_name, &back);
    if (memcmp(&back, sp, sizeof back) != 0)
        return qk__fail(QK_ERROR_UNSUPPORTED, "the part's plan differs from the whole job's beyond what a part holds "
                        "(path %d / %d, precision %s / %s; internal error)", (int)sp->path, (int)plan->path,
                        qk_precision_name(sp->precision), qk_precision_name(plan->precision));
    return QK_OK;
}

/* A plan of several devices carries every device's parts, those qk__mgpu_parts names, in order
   (a plan made by qk_plan_make or qk_plan_for_devices does; one put together otherwise may not):
   QK_OK, else QK_ERROR_INVALID_ARGUMENT with a message naming the first difference. */
QK__PRIV qk_result qk__mgpu_check_parts(const qk_plan *plan)
{
    int k, i, n = 0;
    if (plan->n_parts < 0 || plan->n_parts > QK_MAX_PARTS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: plan.n_parts = %d (at most %d)", plan->n_parts, QK_MAX_PARTS);
    for (k = 0; k < plan->n_devices; k++) {
        int64_t part[2][3];
        const int np = qk__mgpu_parts(plan, k, part);
        for (i = 0; i < np; i++, n++) {
            const qk_plan_part *pp = &plan->parts[n];
            if (n >= plan->n_parts || pp->device != k || pp->symmetric != (int)part[i][2] || pp->row0 != plan->dev_row0[k] ||
                pp->n_rows != plan->dev_row0[k + 1] - plan->dev_row0[k] || pp->col0 != part[i][0] || pp->n_cols != part[i][1] - part[i][0] ||
                pp->mirror != (plan->symmetric && !pp->symmetric && !plan->dev_full_rows))
                return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: a plan of %d GPUs without the plan of GPU %d's part %d "
                                "(plan.parts; qk_plan_make and qk_plan_for_devices make them)", plan->n_devices, plan->devices[k], i + 1);
        }
    }
    if (n != plan->n_parts)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_gram: plan.n_parts = %d, the devices' rows make %d parts", plan->n_parts, n);
    return QK_OK;
}

static qk_result qk__plan_for_device(const qk_device_info *info, double vram_fraction,
                                    const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep)
{
    if (!info || !map || !desc || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: NULL argument");
    if (!(vram_fraction >= 0.0 && vram_fraction <= 1.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: vram_fraction must be in (0, 1] (got %g)", vram_fraction);
    if (desc->n_x <= 0 || (desc->y && desc->n_y <= 0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: n_x and n_y must be > 0");
    if ((int)desc->precision < (int)QK_PRECISION_DEFAULT || (int)desc->precision >= QK_PRECISION_COUNT)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: unknown precision %d", (int)desc->precision);
    if (!(desc->tol >= 0.0 && desc->tol <= 1e300))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_plan_for_device: tol must be finite and >= 0 (got %g)", desc->tol);
    if (keep) memset(keep, 0, sizeof *keep);
    if (!info->present) return qk__plan_cpu(info, map, desc, out, keep);
    /* an entangled map with the path left to the planner or forced to MPS: the GPU's statevector
       plan (when it can be made) against the MPS path on the GPU (qk__mps_decide) */
    if ((int)desc->path < 0 || (int)desc->path > (int)QK_PATH_MPS || desc->path == QK_PATH_MPS ||
        (map->cls != QK_CLASS_PRODUCT && desc->path == QK_PATH_DEFAULT)) {
        qk__mps_prog prog;
        qk_result rs = QK_ERROR_UNSUPPORTED, r;
        int use = 0;
        if (desc->path == QK_PATH_DEFAULT && map->n_qubits <= QK_MAX_STATE_QUBITS)
            rs = qk__plan_cuda(info, vram_fraction, map, desc, out);
        r = qk__mps_decide(map, desc, QK__MPS_GPU_FLOP_RATIO, rs == QK_OK, 0, &prog, &use);
        if (r != QK_OK) return r;
        if (!use)   /* the statevector plan, or its error again (with its detail) */
            return rs == QK_OK ? QK_OK : qk__plan_cuda(info, vram_fraction, map, desc, out);
        r = qk__plan_cuda_mps(info, vram_fraction, map, desc, &prog, out);
        if (r == QK_OK && keep) *keep = prog;   /* the engine's program: not built again */
        else qk__mps_prog_free(&prog);
        return r;
    }
    return qk__plan_cuda(info, vram_fraction, map, desc, out);
}

/* Autotune of a CUDA plan (qk_ctx_desc.autotune, docs/autotune.md): the Gram engine's
   configuration ("engine=E,cfg=C": qk_plan.engine by its qk__engine_name, and kernel_cfg) for
   (device, driver, path, precision, qubits) comes from the cache, or from qk_cuda_tune_gram on a
   miss (stored), or from the fixed table above; plan->config says which. For qk_plan_make: call
   after qk_plan_for_device. */

#if defined(QK_CUDA) && QK_CUDA
/* The engine configuration an autotune cache entry names: "engine=<name>,cfg=<c>", or the form
   written before qk_plan.engine, "blas=<n>,cfg=<c>" (n the engine's value, which the enum kept).
   0 for anything else (the entry is then ignored: the fixed table). */
static int qk__engine_config_parse(const char *s, qk_gpu_engine *e, int *cfg)
{
    char name[24];
    int n, c, k;
    if (sscanf(s, "blas=%d,cfg=%d", &n, &c) == 2) {
        if (n < 0 || n >= (int)QK_GPU_ENGINE_COUNT) return 0;
        *e = (qk_gpu_engine)n;
        *cfg = c;
        return 1;
    }
    if (sscanf(s, "engine=%23[^,],cfg=%d", name, &c) != 2) return 0;
    for (k = 0; k < (int)QK_GPU_ENGINE_COUNT; k++)
        if (strcmp(name, qk__engine_name((qk_gpu_engine)k)) == 0) {
            *e = (qk_gpu_engine)k;
            *cfg = c;
            return 1;
        }
    return 0;
}
static qk_result qk__cuda_measure(const qk_tune_key *key, char *config, size_t size, double *metric, void *user)
{
    const qk_plan *plan = (const qk_plan *)user;
    qk_cuda_tune_result res;
    char err[256] = "";
    int64_t n = key->n_qubits <= 8 ? 16384 : key->n_qubits <= 12 ? 4096 : 1024;
    qk_result r = qk_cuda_tune_gram(plan, n, 3, &res, err, sizeof err);
    const char *name;
    if (r != QK_OK) return qk__fail(r, "%s", err);
    name = qk__engine_name((qk_gpu_engine)res.blas[res.best]);
    if (!name) return qk__fail(QK_ERROR_UNSUPPORTED, "autotune: candidate engine %d (internal error)", res.blas[res.best]);
    snprintf(config, size, "engine=%s,cfg=%d", name, res.cfg[res.best]);
    *metric = (double)res.n_samples * (double)res.n_samples / (res.ms[res.best] * 1e6); /* Gpairs/s */
    return QK_OK;
}

QK__PRIV void qk__plan_autotune(const qk_device_info *info, int mode, const char *cache_dir, qk_log_fn log,
                                void *log_user, qk_plan *plan)
{
    qk_tune_request req;
    char fixed[48], chosen[64], label[96];
    qk_gpu_engine b = plan->engine, pe = plan->engine;
    int c = plan->kernel_cfg;
    /* density matrices (plan.linear) run the cuBLAS engine the planner named: the other engines
       square the inner product (and the cache keys do not tell the two jobs apart) */
    if (plan->backend != QK_BACKEND_CUDA || plan->path == QK_PATH_ANALYTIC || plan->linear) return;
    memset(&req, 0, sizeof req);
    qk_tune_key_init(&req.key, info->name, info->cc_major, info->cc_minor, info->driver_version, "gram", plan->path,
                     plan->precision, plan->n_qubits);
    snprintf(fixed, sizeof fixed, "engine=%s,cfg=%d", qk__engine_name(plan->engine), plan->kernel_cfg);
    req.mode = mode;
    req.cache_dir = cache_dir;
    req.fixed_config = fixed;
    req.measure = qk__cuda_measure;
    req.measure_user = plan;
    req.log = log;
    req.log_user = log_user;
    if (qk_tune_choose(&req, chosen, sizeof chosen, label, sizeof label) != QK_OK) return;
    /* a tensor-core engine only where the planner counted its operands (not where they did not
       fit: the planner fell back to CUBLAS) */
    if (qk__engine_config_parse(chosen, &b, &c) && c >= 0 && c <= QK__N_FUSED_CFG &&
        qk__blas_ok(plan->precision, plan->path, b) &&
        /* the fused tensor-core kernel only where the planner counted its operands */
        !(qk__engine_tcf(b) && qk__tcf_ws(b, plan->path == QK_PATH_COMPLEX, plan->n_qubits,
                                          plan->bulk_states ? (double)(plan->n_x + (plan->symmetric ? 0 : plan->n_y)) : 2.0 * (double)plan->state_tile) >
                                   (double)plan->bytes_workspace) &&
        !((b == QK_GPU_TCF_TF32 || b == QK_GPU_TCF_FP16) && plan->n_qubits > QK__TCF_NOFLUSH_MAX_QUBITS) &&
        /* the wgmma configuration only where this device and build run it (a cache written by
           another build may name it) */
        !(qk__engine_tcf(b) && c == 4 && !info->wgmma) &&
        !(qk__engine_tcf_of(b) != QK_GPU_FUSED && qk__engine_tcf(pe) &&
          qk__blas_ws(b, plan->path == QK_PATH_COMPLEX, plan->n_qubits, 4.0, (double)plan->tile_m, (double)plan->tile_n) > (double)plan->bytes_workspace) &&
        !((qk__engine_tc(b) || qk__engine_tcf(b)) && pe == QK_GPU_CUBLAS && qk__tc_mode(plan->precision) && plan->n_qubits >= qk__tc_min_qubits(plan->precision)) &&
        !((qk__engine_tc(b) || qk__engine_tcf(b)) && plan->n_qubits > QK__TC_MAX_QUBITS)) {
        qk__plan_set_engine(plan, b);
        plan->kernel_cfg = qk__plan_cfg_runs(plan, b, c);   /* the configuration that runs (8 -> 7 -> 1, ...) */
    }
    if (plan->engine == b && plan->kernel_cfg != c)
        snprintf(plan->config, sizeof plan->config, "%.72s (runs cfg %d)", label, plan->kernel_cfg);
    else snprintf(plan->config, sizeof plan->config, "%s", label);
}
#endif /* QK_CUDA */

/* Largest n such that K(X,X) of n samples keeps all its states resident (bulk) on the device,
   for a zz-like map of n_qubits (scratch counted as for a map with one gate layer and two
   phase runs); K itself is not counted (it may go out in slabs). */
QKDEF int64_t qk_max_samples(const qk_device_info *info, double vram_fraction, int n_qubits,
                             qk_precision precision)
{
    double t = precision == QK_PRECISION_FP64 ? 8.0 : 4.0, q = n_qubits, st, sc, budget;
    if (!info || n_qubits < 1 || n_qubits > QK_MAX_STATE_QUBITS) return 0;
    if (!info->present) {
        /* the CPU plan's bulk test (qk__plan_cpu_nt) for a complex map of one gate layer: the
           states (fp64 complex, 16 x 2^q bytes each) and the scratch of every core's thread */
        double avail, b = qk__host_budget(info, &avail), scr = qk__cpu_scratch_q(n_qubits, qk__ncores());
        double per = 16.0 * ldexp(1.0, n_qubits);
        return b > scr ? (int64_t)floor((b - scr) / per) : 0;
    }
    budget = (vram_fraction > 0 && vram_fraction <= 1 ? vram_fraction : 0.85) * (double)info->free_bytes;
    /* a complex zz-like map with a feature per qubit: 20 params per qubit, two phase runs */
    qk__vram_per_state(n_qubits, n_qubits, 20.0 * q + 2.0 * (1 + q + q * q) + 1, QK_PATH_COMPLEX, t, &st, &sc);
    return (int64_t)floor(0.5 * budget / (st + sc)); /* integers below 2^53: exact in any order */
}

/* ---- end planner ---- */

