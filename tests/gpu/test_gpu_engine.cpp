/* GPU engine tests: states and Gram from qk_cuda.cu against an independent float64 reference.

   The reference here simulates every op gate by gate (dense 2x2 and CNOT permutations, no
   diagonal folding, no passes) from angles evaluated in double, so it shares nothing with the
   engine but the map IR. Every run draws fresh random inputs (seed printed, QK_TEST_SEED to
   replay), poisons the outputs with NaN first and checks every element.

   Tolerances (|got - ref| <= abs + rel * |ref|):
     fp64: states 1e-10, K 1e-10 + 1e-9 |ref|
     fp32: states 2e-5 * (1 + q/4), K 1e-4 * (1 + q/4) + 2^-24 * 2^q / 4 + 1e-4 |ref|
           (float rounding in the amplitudes grows with the passes and the phase sum; a float
           sum of 2^q products drifts by a fraction of 2^q ulps of 1 on the diagonal: 4e-3 at
           q = 19 (fused kernel), 9.4e-3 at q = 20 (cuBLAS, the peer's engine too); the
           bound is a few times the error seen, and a wrong index or sign gives errors ~1)
     tensor-core engines (plan.engine QK_GPU_TC_TF32 .. TC_BF16): the fp32 tolerance (the states are the same
           float states) plus the bound of the operand rounding, op_bound() below:
           2 sqrt(2) e_p, e_p the relative error of one product of rounded operands
           (2u + u^2: u = 2^-11 TF32 and FP16, 2^-8 BF16; FP32X3 3 * 2^-22)
     fp64 real form (QK_GPU_TC_FP64): as fp64
   A second part runs the public API end to end: qk_gram on a CUDA context (planner included)
   against qk_gram on a CPU context, for the built-in maps from spec strings. The largest error
   seen per engine, map and qubit count is printed as a table at the end (docs/precision.md).
   Exit 77 (meson: skipped) when no CUDA device exists. */
#include <algorithm>
#include <complex>
#include <vector>
#include <string>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <cuda_runtime.h>
#define QK_IMPLEMENTATION
#include "qk.h"

typedef std::complex<double> cd;

#include "../qk_test.h"

/* ---- maps built by hand from the documented conventions ---- */
struct TMap {
    std::string name;
    std::vector<qk_op> ops;
    std::vector<double> w;
    int q, d;
    qk_map_class cls;
    qk_map m;
    void finish() {
        memset(&m, 0, sizeof m);
        m.type = QK_MAP_CUSTOM;
        m.cls = cls;
        m.n_qubits = q;
        m.n_features = d;
        m.n_weights = (int)w.size();
        m.n_ops = (int)ops.size();
        m.ops = ops.data();
        m.weights = w.data();
    }
};

static qk_op op1(qk_op_kind k, int q0, qk_arg_kind ak = QK_ARG_CONST, int x0 = 0, int x1 = 0, double scale = 1, double off = 0, int w = 0)
{
    qk_op o;
    memset(&o, 0, sizeof o);
    o.kind = k; o.q0 = q0; o.q1 = -1;
    o.angle.kind = ak; o.angle.x0 = x0; o.angle.x1 = x1; o.angle.scale = scale; o.angle.offset = off; o.angle.w = w;
    return o;
}
static qk_op op2(qk_op_kind k, int a, int b, qk_arg_kind ak = QK_ARG_CONST, int x0 = 0, int x1 = 0, double scale = 1)
{
    qk_op o = op1(k, a, ak, x0, x1, scale);
    o.q1 = b;
    return o;
}

static TMap map_zz(int q, int reps, bool full)
{
    TMap t; t.name = full ? "zz" : "zz-linear"; t.q = q; t.d = q; t.cls = q > 1 ? QK_CLASS_COMPLEX : QK_CLASS_PRODUCT;
    for (int r = 0; r < reps; ++r) {
        for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_H, i));
        for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_P, i, QK_ARG_X, i, 0, 2.0));
        for (int i = 0; i < q; ++i)
            for (int j = i + 1; j < q; ++j) {
                if (!full && j != i + 1) continue;
                t.ops.push_back(op2(QK_OP_CNOT, i, j));
                t.ops.push_back(op1(QK_OP_P, j, QK_ARG_PIXX, i, j, 2.0));
                t.ops.push_back(op2(QK_OP_CNOT, i, j));
            }
    }
    t.finish();
    return t;
}
static TMap map_iqp(int q)
{
    TMap t; t.name = "iqp"; t.q = q; t.d = q; t.cls = q > 1 ? QK_CLASS_COMPLEX : QK_CLASS_PRODUCT;
    for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_H, i));
    for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_RZ, i, QK_ARG_X, i));
    for (int i = 0; i < q; ++i)
        for (int j = i + 1; j < q; ++j) t.ops.push_back(op2(QK_OP_RZZ, i, j, QK_ARG_XX, i, j));
    t.finish();
    return t;
}
static TMap map_angle(int q, char rot)
{
    TMap t; t.name = std::string("angle-") + rot; t.q = q; t.d = q; t.cls = QK_CLASS_PRODUCT;
    for (int i = 0; i < q; ++i) t.ops.push_back(op1(rot == 'x' ? QK_OP_RX : rot == 'y' ? QK_OP_RY : QK_OP_RZ, i, QK_ARG_X, i));
    t.finish();
    return t;
}
static TMap map_amp(int q)
{
    TMap t; t.name = "amplitude"; t.q = q; t.d = (1 << q) - (q > 1 ? 1 : 0); /* padding exercised */
    t.cls = QK_CLASS_REAL;
    t.ops.push_back(op1(QK_OP_AMPLITUDE, 0));
    t.finish();
    return t;
}
static TMap map_basis(int q)
{
    TMap t; t.name = "basis"; t.q = q; t.d = q; t.cls = QK_CLASS_PRODUCT;
    for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_BASIS, i, QK_ARG_X, i));
    t.finish();
    return t;
}
static TMap map_hea(int q, int layers, char rot, bool cnot)
{
    TMap t; t.name = std::string("hea-") + rot + (cnot ? "-cnot" : "-cz"); t.q = q; t.d = q;
    t.cls = q == 1 ? QK_CLASS_PRODUCT : (rot == 'y' ? QK_CLASS_REAL : QK_CLASS_COMPLEX);
    for (int l = 0; l < layers; ++l) {
        for (int i = 0; i < q; ++i) {
            t.ops.push_back(op1(QK_OP_RY, i, QK_ARG_WX, i, 0, 1, 0, (int)t.w.size()));
            t.w.push_back(qk_test_uniform(0.3, 1.5));
            if (rot == 'z') {
                t.ops.push_back(op1(QK_OP_RZ, i, QK_ARG_WX, i, 0, 1, 0, (int)t.w.size()));
                t.w.push_back(qk_test_uniform(0.3, 1.5));
            }
        }
        if (q > 1)
            for (int i = 0; i < q; ++i) {
                int j = (i + 1) % q;
                if (q == 2 && i == 1) break;
                t.ops.push_back(op2(cnot ? QK_OP_CNOT : QK_OP_CZ, i, j));
            }
    }
    t.finish();
    return t;
}
/* Every op kind and angle kind, in an order that defeats the diagonal folding half the time. */
static TMap map_mix(int q)
{
    TMap t; t.name = "mix"; t.q = q; t.d = q + 1; t.cls = q > 1 ? QK_CLASS_COMPLEX : QK_CLASS_PRODUCT;
    t.w = {0.7, -1.3};
    for (int i = 0; i < q; ++i) {
        t.ops.push_back(op1(QK_OP_H, i));
        t.ops.push_back(op1(QK_OP_RX, i, QK_ARG_X, i, 0, 0.8, 0.1));
        t.ops.push_back(op1(QK_OP_RY, i, QK_ARG_XX, i, i + 1, -0.5, 0.3));
        t.ops.push_back(op1(QK_OP_Y, i));
    }
    for (int i = 0; i + 1 < q; ++i) {
        t.ops.push_back(op2(QK_OP_CNOT, i + 1, i));
        t.ops.push_back(op1(QK_OP_RZ, i, QK_ARG_W, 0, 0, 1.1, 0, 0));
        t.ops.push_back(op2(QK_OP_CNOT, i + 1, i));
        t.ops.push_back(op2(QK_OP_CZ, i, q - 1));
        t.ops.push_back(op1(QK_OP_Z, i));
        t.ops.push_back(op1(QK_OP_X, i + 1));
        int zb = q - 1 - i == i ? (i + 1) % q : q - 1 - i;
        t.ops.push_back(op2(QK_OP_RZZ, zb, i, QK_ARG_PIXX, i, zb, 0.4));
        t.ops.push_back(op1(QK_OP_P, i, QK_ARG_WX, i + 1, 0, 0.9, -0.2, 1));
        if (q > 2) t.ops.push_back(op2(QK_OP_CNOT, i, (i + 2) % q));
    }
    for (int i = 0; i < q; ++i) t.ops.push_back(op1(QK_OP_RX, i, QK_ARG_CONST, 0, 0, 1, 0.77 * i));
    t.finish();
    return t;
}

/* ---- float64 reference ---- */
static double ref_theta(const qk_angle &a, const double *x, const std::vector<double> &w)
{
    double f = 0;
    switch (a.kind) {
    case QK_ARG_CONST: f = 0; break;
    case QK_ARG_X: f = x[a.x0]; break;
    case QK_ARG_XX: f = x[a.x0] * x[a.x1]; break;
    case QK_ARG_PIXX: f = (M_PI - x[a.x0]) * (M_PI - x[a.x1]); break;
    case QK_ARG_W: f = w[a.w]; break;
    case QK_ARG_WX: f = w[a.w] * x[a.x0]; break;
    default: break;
    }
    return a.scale * f + a.offset;
}

static void ref_state(const TMap &t, const double *x, cd *psi)
{
    const size_t D = (size_t)1 << t.q;
    for (size_t i = 0; i < D; ++i) psi[i] = 0;
    psi[0] = 1;
    const cd I(0, 1);
    for (const qk_op &o : t.ops) {
        double th = ref_theta(o.angle, x, t.w);
        double c = cos(th / 2), s = sin(th / 2);
        cd m[4];
        bool one = true;
        switch (o.kind) {
        case QK_OP_AMPLITUDE: {
            double nrm = 0;
            for (int k = 0; k < t.d; ++k) nrm += x[k] * x[k];
            nrm = sqrt(nrm);
            for (size_t i = 0; i < D; ++i) psi[i] = (int)i < t.d ? x[i] / nrm : 0.0;
            one = false;
        } break;
        case QK_OP_H: m[0] = m[1] = m[2] = M_SQRT1_2; m[3] = -M_SQRT1_2; break;
        case QK_OP_X: m[0] = 0; m[1] = 1; m[2] = 1; m[3] = 0; break;
        case QK_OP_Y: m[0] = 0; m[1] = -I; m[2] = I; m[3] = 0; break;
        case QK_OP_Z: m[0] = 1; m[1] = 0; m[2] = 0; m[3] = -1; break;
        case QK_OP_RX: m[0] = c; m[1] = -I * s; m[2] = -I * s; m[3] = c; break;
        case QK_OP_RY: m[0] = c; m[1] = -s; m[2] = s; m[3] = c; break;
        case QK_OP_RZ: m[0] = std::exp(-I * (th / 2)); m[1] = 0; m[2] = 0; m[3] = std::exp(I * (th / 2)); break;
        case QK_OP_P: m[0] = 1; m[1] = 0; m[2] = 0; m[3] = std::exp(I * th); break;
        case QK_OP_BASIS:
            if (x[o.angle.x0] == 1.0) { m[0] = 0; m[1] = 1; m[2] = 1; m[3] = 0; } else { m[0] = 1; m[1] = 0; m[2] = 0; m[3] = 1; }
            break;
        case QK_OP_CNOT:
            one = false;
            for (size_t i = 0; i < D; ++i)
                if ((i >> o.q0 & 1) && !(i >> o.q1 & 1)) std::swap(psi[i], psi[i | ((size_t)1 << o.q1)]);
            break;
        case QK_OP_CZ:
            one = false;
            for (size_t i = 0; i < D; ++i) if ((i >> o.q0 & 1) && (i >> o.q1 & 1)) psi[i] = -psi[i];
            break;
        case QK_OP_RZZ:
            one = false;
            {
                const cd ep = std::exp(-I * (th / 2)), em = std::exp(I * (th / 2)); /* Z(x)Z = +1, -1 */
                for (size_t i = 0; i < D; ++i) psi[i] *= ((i >> o.q0 & 1) ^ (i >> o.q1 & 1)) ? em : ep;
            }
            break;
        default: one = false;
        }
        if (!one) continue;
        size_t b = (size_t)1 << o.q0;
        for (size_t i = 0; i < D; ++i) {
            if (i & b) continue;
            cd a0 = psi[i], a1 = psi[i | b];
            psi[i] = m[0] * a0 + m[1] * a1;
            psi[i | b] = m[2] * a0 + m[3] * a1;
        }
    }
}

static std::vector<double> rand_x(const TMap &t, int64_t n)
{
    std::vector<double> x((size_t)n * t.d);
    for (int64_t s = 0; s < n; ++s)
        for (int k = 0; k < t.d; ++k) {
            double v;
            if (t.name == "basis") v = (qk_test_rand64() & 1) ? 1.0 : 0.0;
            else if (t.name == "amplitude") v = qk_test_uniform(-1, 1);
            else v = qk_test_uniform(0, 2 * M_PI);
            x[(size_t)s * t.d + k] = v;
        }
    if (t.name == "amplitude" && n > 0) x[0] = 0.0; /* a zero component (not a zero row) */
    return x;
}

static int g_cfg = 0; /* fused kernel configuration under test (0: the fixed table) */
/* 1 when device 0 runs the fused tensor-core kernel's configuration 4 (wgmma: compute capability
   9.0 and an sm_90a build); the suites then test it beside 1 and 2 */
static int wg_ok()
{
    static int ok = -1;
    if (ok < 0) {
        qk_device_info info;
        char err[256];
        ok = qk_cuda_device_query(0, &info, err, sizeof err) == QK_OK && info.wgmma;
        printf("wgmma kernels (fused tensor-core configuration 4): %s\n", ok ? "tested" : "not on this device or build");
    }
    return ok;
}
/* next configuration of the fused tensor-core kernel to test after c (0, 1, 2[, 3][, 4]) */
static int tcf_next(int c, int last_mma) { return c < last_mma ? c + 1 : c < 4 && wg_ok() ? 4 : 99; }
static qk_plan make_plan(const TMap &t, int64_t nx, int64_t ny, bool sym, qk_precision prec, qk_dtype od, qk_output out)
{
    qk_plan p;
    memset(&p, 0, sizeof p);
    p.backend = QK_BACKEND_CUDA;
    p.path = t.cls == QK_CLASS_PRODUCT ? QK_PATH_ANALYTIC : t.cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
    p.precision = prec;
    p.out_dtype = od;
    p.output = out;
    p.n_qubits = t.q;
    p.n_x = nx;
    p.n_y = ny;
    p.symmetric = sym;
    p.bulk_states = 1;
    p.state_tile = 0;
    p.tile_m = 1024;
    p.k_resident = 1;
    p.n_streams = 2;
    p.kernel_cfg = g_cfg;
    return p;
}

struct CbRec { std::vector<double> K; int64_t ny; int is64; int calls; bool sym; int bad; };
static int tile_cb(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    CbRec *r = (CbRec *)user;
    r->calls++;
    if (r->sym && j0 < i0) r->bad++;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double v = r->is64 ? ((const double *)tile)[i * ld + j] : ((const float *)tile)[i * ld + j];
            r->K[(size_t)(i0 + i) * r->ny + j0 + j] = v;
            if (r->sym) r->K[(size_t)(j0 + j) * r->ny + i0 + i] = v;
        }
    return 0;
}

/* K error bound from rounding the operands of tensor-core engine `blas` (0 for the others).
   The fused kernels' real form: Re and Im of <a|b> each carry at most e_p sum |a_k||b_k| <= e_p
   (unit states, Cauchy-Schwarz), so |K - K'| <= 2 |<a|b>| |delta| + |delta|^2 <= 2 sqrt(2) e_p
   (+ 2 e_p^2). The cuBLAS engines' Gauss product (T1 + T2, T3 - T1 + T2 with T3 = (ar - ai) .
   (br + bi), sum |ar - ai||br + bi| <= 2): Re <= e, Im <= 3e, e = e_p + 2^-23 (the fp32 sums
   re -+ im), |delta| <= sqrt(10) e. */
static double op_bound(int blas)
{
    const bool fused = blas >= 8 && blas <= 10;
    if (fused) blas -= 5; /* the fused tensor-core kernel: the same operands */
    const double u = blas == 3 || blas == 5 ? ldexp(1.0, -11) : blas == 6 ? ldexp(1.0, -8) : 0.0;
    const double ep = blas == 4 ? 3.0 * ldexp(1.0, -22) : 2.0 * u + u * u, e = ep + ldexp(1.0, -23);
    if (!(blas >= 3 && blas <= 6)) return 0.0;
    return fused ? 2.0 * sqrt(2.0) * ep + 2.0 * ep * ep : 2.0 * sqrt(10.0) * e + 10.0 * e * e;
}
static const char *engine_name(qk_precision prec, int blas)
{
    if (prec == QK_PRECISION_FP64) return "fp64";
    switch (blas) {
    case 3: return "tf32"; case 4: return "fp32x3"; case 5: return "fp16"; case 6: return "bf16";
    case 8: return "tf32-fused"; case 9: return "fp32x3-fused"; case 10: return "fp16-fused";
    default: return "fp32";
    }
}
/* largest |K - ref| per (engine, qubits, map family) */
static std::map<std::string, std::map<int, std::map<std::string, double>>> g_errtab;
static void record_err(const char *engine, int q, const std::string &map, double e)
{
    double &v = g_errtab[engine][q][map];
    if (!(e <= v)) v = e;
}
static void print_errq(int q) /* one line per qubit count as the run goes (a cut-off run keeps them) */
{
    printf("errq %2d", q);
    for (auto &eng : g_errtab) {
        auto it = eng.second.find(q);
        if (it == eng.second.end()) continue;
        double m = 0;
        for (auto &me : it->second) m = std::max(m, me.second);
        printf("  %s %.2g", eng.first.c_str(), m);
    }
    printf("\n");
}
static void print_errtab()
{
    printf("\nlargest |K - K_fp64| per engine and qubits (max over the maps; per map family below)\n");
    for (auto &eng : g_errtab) {
        printf("%-7s", eng.first.c_str());
        for (auto &qe : eng.second) {
            double m = 0;
            for (auto &me : qe.second) m = std::max(m, me.second);
            printf(" q%d %.2g", qe.first, m);
        }
        printf("\n");
    }
    for (auto &eng : g_errtab)
        for (auto &qe : eng.second)
            for (auto &me : qe.second) printf("err %s %d %s %.3g\n", eng.first.c_str(), qe.first, me.first.c_str(), me.second);
}

/* Runs one Gram configuration and compares every entry (keep: K's bytes as the call left them,
   padding included, for a comparison of two paths). */
static void check_gram(const TMap &t, const std::vector<cd> &SA, const std::vector<cd> &SB, const std::vector<double> &xa,
                       const std::vector<double> &xb, int64_t nx, int64_t ny, bool sym, qk_precision prec, qk_dtype od,
                       qk_output out, int use_blas, int64_t slab, int64_t state_tile, int resident, int64_t ld_extra,
                       const char *what, std::vector<unsigned char> *keep = nullptr)
{
    const size_t D = (size_t)1 << std::min(t.q, 30);
    std::vector<double> ref((size_t)nx * ny);
    for (int64_t i = 0; i < nx; ++i)
        for (int64_t j = 0; j < ny; ++j) {
            cd acc = 0;
            for (size_t k = 0; k < D; ++k) acc += std::conj(SA[i * D + k]) * (sym ? SA : SB)[j * D + k];
            ref[(size_t)i * ny + j] = std::norm(acc);
        }
    qk_plan p = make_plan(t, nx, ny, sym, prec, od, out);
    p.engine = (qk_gpu_engine)(use_blas < 0 ? t.q >= 7 : use_blas);
    p.tile_m = slab;
    if (state_tile > 0) { p.bulk_states = 0; p.state_tile = state_tile; }
    p.k_resident = resident;
    const int64_t ld = ny + ld_extra;
    const size_t es = od == QK_F64 ? 8 : 4;
    std::vector<unsigned char> host((size_t)nx * ld * es);
    /* poison: NaN everywhere (padding included, which must stay NaN) */
    for (size_t i = 0; i < host.size() / es; ++i) {
        if (es == 8) ((double *)host.data())[i] = NAN; else ((float *)host.data())[i] = NAN;
    }
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = xa.data(); g.n_x = nx;
    g.y = sym ? nullptr : xb.data(); g.n_y = sym ? 0 : ny;
    g.ld_out = ld; g.out_dtype = od; g.output = out; g.precision = prec;
    void *dptr = nullptr;
    CbRec cb;
    cb.K.assign((size_t)nx * ny, NAN); cb.ny = ny; cb.is64 = es == 8; cb.calls = 0; cb.sym = sym; cb.bad = 0;
    if (out == QK_OUTPUT_DEVICE) {
        cudaMalloc(&dptr, host.size());
        cudaMemcpy(dptr, host.data(), host.size(), cudaMemcpyHostToDevice);
        g.out = dptr;
    } else if (out == QK_OUTPUT_CALLBACK) {
        g.tile_fn = tile_cb; g.tile_user = &cb;
    } else g.out = host.data();
    char err[640] = "";
    if (out == QK_OUTPUT_HOST) p.host_pinned = qk_cuda_host_pinned(g.out);
    qk_result r = qk__plan_run(NULL, &p, &t.m, &g, NULL);
    if (r != QK_OK) snprintf(err, sizeof err, "%s", qk_last_error());
    CHECK(r == QK_OK, "%s q=%d %s: qk__plan_run -> %d (%s)", t.name.c_str(), t.q, what, (int)r, err);
    if (r != QK_OK) { if (dptr) cudaFree(dptr); return; }
    if (out == QK_OUTPUT_DEVICE) { cudaMemcpy(host.data(), dptr, host.size(), cudaMemcpyDeviceToHost); cudaFree(dptr); }
    if (keep) *keep = host;
    const double qf = 1 + t.q / 4.0;
    const double tabs = prec == QK_PRECISION_FP64 && od == QK_F64 ? 1e-10 : 1e-4 * qf + ldexp(1.0, t.q - 24) / 4 + op_bound(p.engine);
    const double trel = prec == QK_PRECISION_FP64 && od == QK_F64 ? 1e-9 : 1e-4;
    double maxerr = 0;
    int64_t bad = 0, pad_bad = 0;
    for (int64_t i = 0; i < nx; ++i) {
        for (int64_t j = 0; j < ld; ++j) {
            double v;
            if (out == QK_OUTPUT_CALLBACK) { if (j >= ny) continue; v = cb.K[(size_t)i * ny + j]; }
            else v = es == 8 ? ((double *)host.data())[i * ld + j] : ((float *)host.data())[i * ld + j];
            if (j >= ny) { if (!std::isnan(v)) pad_bad++; continue; }
            double rv = ref[(size_t)i * ny + j];
            double e = fabs(v - rv);
            if (!(e <= tabs + trel * fabs(rv))) { if (bad < 3) printf("  K[%lld][%lld] = %.9g ref %.9g\n", (long long)i, (long long)j, v, rv); bad++; }
            if (e > maxerr || std::isnan(e)) maxerr = std::isnan(e) ? INFINITY : e;
        }
    }
    CHECK(bad == 0, "%s q=%d %s: %lld of %lld entries off (max err %.3g, tol %.1g + %.1g|ref|)", t.name.c_str(), t.q, what,
          (long long)bad, (long long)(nx * ny), maxerr, tabs, trel);
    if (t.cls != QK_CLASS_PRODUCT && (prec != QK_PRECISION_FP64 || od == QK_F64))
        record_err(engine_name(prec, p.engine), t.q, t.name, maxerr);
    CHECK(pad_bad == 0, "%s q=%d %s: %lld padding entries (ld > n) written", t.name.c_str(), t.q, what, (long long)pad_bad);
    if (out == QK_OUTPUT_CALLBACK) CHECK(cb.calls > 0 && cb.bad == 0, "%s q=%d %s: callback tiles %d, %d below diagonal", t.name.c_str(), t.q, what, cb.calls, cb.bad);
}

static void run_map(const TMap &t, bool thorough)
{
    const int q = t.q;
    const size_t D = (size_t)1 << q;
    /* sizes: not multiples of any tile (64, 128, slabs) */
    int64_t nx = q <= 8 ? 133 : q <= 12 ? 37 : q <= 16 ? 9 : 3;
    int64_t ny = q <= 8 ? 70 : q <= 12 ? 21 : q <= 16 ? 5 : 2;
    std::vector<double> xa = rand_x(t, nx), xb = rand_x(t, ny);
    std::vector<cd> SA(nx * D), SB(ny * D);
    for (int64_t s = 0; s < nx; ++s) ref_state(t, &xa[s * t.d], &SA[s * D]);
    for (int64_t s = 0; s < ny; ++s) ref_state(t, &xb[s * t.d], &SB[s * D]);

    /* states, both precisions; fp32 at 14-16 qubits also through the two launches that the
       fused structured pass replaces (QK_STATES_OLD=1), and zz must take the fused pass on a
       device that runs it (compute capability 9.0 or later; iqp's program is one pass: nothing to
       fuse) */
    int cc_major = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    const bool fz_family = t.name == "zz" || t.name == "zz-linear";
    for (int pi = 0; pi < 3; ++pi) {
        const bool old_path = pi == 2;
        if (old_path && !(q >= 14 && q <= 16)) continue;
        qk_precision prec = pi == 1 ? QK_PRECISION_FP64 : QK_PRECISION_FP32;
        std::vector<double> got(nx * D * 2, NAN);
        char err[256] = "";
        if (old_path) setenv("QK_STATES_OLD", "1", 1);
        const int fz0 = qk_cuda_test_states_fused();
        qk_result r = qk_cuda_states(&t.m, xa.data(), nx, prec, got.data(), err, sizeof err);
        const int fz = qk_cuda_test_states_fused() - fz0;
        if (old_path) unsetenv("QK_STATES_OLD");
        CHECK(r == QK_OK, "%s q=%d states: %d %s", t.name.c_str(), q, (int)r, err);
        const bool want_fz = pi == 0 && q >= 14 && q <= 16 && fz_family && cc_major >= 9;
        if (pi == 0 && q >= 14 && q <= 16) printf("%-12s q=%2d fp32 states: %s\n", t.name.c_str(), q, fz ? "fused structured pass" : "passes");
        CHECK(want_fz ? fz >= 1 : fz == 0, "%s q=%d states %s: %d fused launches, expected %s", t.name.c_str(), q,
              old_path ? "fp32 QK_STATES_OLD" : pi ? "fp64" : "fp32", fz, want_fz ? "some" : "none");
        double tol = pi == 1 ? 1e-10 : 2e-5 * (1 + q / 4.0), maxerr = 0;
        for (size_t i = 0; i < nx * D; ++i) {
            double e = std::abs(cd(got[2 * i], got[2 * i + 1]) - SA[i]);
            if (!(e <= maxerr)) maxerr = std::isnan(e) ? INFINITY : e;
        }
        CHECK(maxerr <= tol, "%s q=%d states %s: max err %.3g > %.1g", t.name.c_str(), q,
              old_path ? "fp32 (two launches)" : pi ? "fp64" : "fp32", maxerr, tol);
    }
    /* Gram: symmetric and rectangular, both precisions, host output */
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, -1, 1024, 0, 1, 0, "sym fp32");
    check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, -1, 1024, 0, 1, 3, "rect fp32 ld+3");
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_HOST, -1, 1024, 0, 1, 0, "sym fp64");
    check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_HOST, -1, 1024, 0, 1, 0, "rect fp64");
    if (q >= 7 && t.cls != QK_CLASS_PRODUCT)
        check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, 1024, 0, 1, 0, "sym fp32 fused");
    /* the tensor-core engines at every qubit count (the planner takes them from 6 qubits on) */
    static const struct { qk_precision p; int b; const char *sym, *rect; } tcm[] = {
        {QK_PRECISION_TF32, 3, "sym tf32", "rect tf32 ld+3"}, {QK_PRECISION_FP32X3, 4, "sym fp32x3", "rect fp32x3 ld+3"},
        {QK_PRECISION_FP16, 5, "sym fp16", "rect fp16 ld+3"}, {QK_PRECISION_FP16, 6, "sym bf16", "rect bf16 ld+3"}};
    if (t.cls != QK_CLASS_PRODUCT && q >= 2) {
        for (auto &c : tcm) {
            check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, QK_F32, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 0, c.sym);
            check_gram(t, SA, SB, xa, xb, nx, ny, false, c.p, QK_F32, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 3, c.rect);
        }
        check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_HOST, 7, 1024, 0, 1, 0, "sym fp64 real form");
        /* the fused tensor-core kernel (QK_GPU_TCF_*) at every qubit count, every tile
           configuration (0 runs 1): K(X,X) (triangular grid, mirror) to the host and the device, K(X,Y)
           with ld + 3 (scalar stores) */
        static const struct { qk_precision p; int b; const char *name; } tcf[] = {
            {QK_PRECISION_TF32, 8, "tf32"}, {QK_PRECISION_FP32X3, 9, "fp32x3"}, {QK_PRECISION_FP16, 10, "fp16"}};
        for (auto &c : tcf) {
            if (c.b != 9 && q > QK__TCF_NOFLUSH_MAX_QUBITS) {
                /* past its limit the kernel refuses (a clear error, K untouched) */
                qk_plan p = make_plan(t, nx, nx, true, c.p, QK_F32, QK_OUTPUT_HOST);
                p.engine = (qk_gpu_engine)c.b;
                p.tile_m = 1024;
                p.k_resident = 1;
                std::vector<float> K((size_t)nx * nx, 7.0f);
                qk_gram_desc g;
                memset(&g, 0, sizeof g);
                g.x = xa.data(); g.n_x = nx; g.out = K.data(); g.out_dtype = QK_F32; g.output = QK_OUTPUT_HOST; g.precision = c.p;
                qk_result r = qk__plan_run(NULL, &p, &t.m, &g, NULL);
                bool untouched = true;
                for (float v : K) untouched = untouched && v == 7.0f;
                CHECK(r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "at most") && untouched,
                      "%s q=%d %s fused past %d qubits: -> %d (%s), K %s", t.name.c_str(), q, c.name,
                      QK__TCF_NOFLUSH_MAX_QUBITS, (int)r, qk_last_error(), untouched ? "untouched" : "written");
                continue;
            }
            for (g_cfg = 0; g_cfg <= 4; g_cfg = tcf_next(g_cfg, 2)) {
                char w1[64], w2[64], w3[64];
                snprintf(w1, sizeof w1, "sym %s fused cfg %d", c.name, g_cfg);
                snprintf(w2, sizeof w2, "rect %s fused cfg %d ld+3", c.name, g_cfg);
                snprintf(w3, sizeof w3, "sym %s fused cfg %d device", c.name, g_cfg);
                check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, QK_F32, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 0, w1);
                check_gram(t, SA, SB, xa, xb, nx, ny, false, c.p, QK_F32, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 3, w2);
                check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, QK_F32, QK_OUTPUT_DEVICE, c.b, 1024, 0, 1, 0, w3);
                if (g_cfg == 4) {   /* the wgmma kernels' double K */
                    snprintf(w1, sizeof w1, "sym %s fused cfg 4 f64 out", c.name);
                    snprintf(w2, sizeof w2, "rect %s fused cfg 4 f64 out", c.name);
                    check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, QK_F64, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 0, w1);
                    check_gram(t, SA, SB, xa, xb, nx, ny, false, c.p, QK_F64, QK_OUTPUT_HOST, c.b, 1024, 0, 1, 0, w2);
                }
            }
        }
        g_cfg = 0;
        check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_HOST, 7, 1024, 0, 1, 0, "rect fp64 real form");
    }
    if (!thorough) return;
    /* every fused tile configuration (device output, ld a multiple of 4: the 16-byte and
       register-store paths) */
    if (t.cls != QK_CLASS_PRODUCT)
        for (g_cfg = 1; g_cfg <= QK__N_FUSED_CFG; ++g_cfg) {   /* the removed 3, 5, 6 run as 1 */
            char what[64];
            snprintf(what, sizeof what, "sym device cfg %d", g_cfg);
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, 1024, 0, 1, 3, what);
        }
    g_cfg = 0;
    /* outputs, slabs, state tiles, residency, the cuBLAS path */
    const int64_t sl = nx > 40 ? 50 : 2, tl = nx > 40 ? 40 : 2;
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, sl, 0, 1, 1, "sym device slabs");
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_CALLBACK, 0, sl, 0, 1, 0, "sym callback");
    check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32, QK_F64, QK_OUTPUT_CALLBACK, 0, sl, 0, 0, 0, "rect callback ring f64out");
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, sl, tl, 0, 2, "sym tiles ring");
    check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, sl, tl, 1, 0, "sym tiles resident");
    check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_DEVICE, 0, sl, tl, 1, 0, "rect tiles device fp64");
    if (t.cls != QK_CLASS_PRODUCT) {
        check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 1, sl, 0, 1, 0, "sym blas");
        check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_HOST, 1, sl, tl, 1, 0, "rect blas tiles fp64");
        check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 1, sl, tl, 1, 0, "sym blas tiles device");
        if (q >= 2) {
            /* tensor-core engines through slabs (the workspace ring), state tiles, device output */
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 4, sl, 0, 1, 1, "sym fp32x3 device slabs");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_TF32, QK_F32, QK_OUTPUT_HOST, 3, sl, tl, 1, 0, "sym tf32 tiles resident");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP16, QK_F32, QK_OUTPUT_HOST, 5, sl, tl, 0, 2, "sym fp16 tiles ring");
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32X3, QK_F64, QK_OUTPUT_CALLBACK, 4, sl, tl, 1, 0, "rect fp32x3 tiles callback f64out");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP64, QK_F64, QK_OUTPUT_DEVICE, 7, sl, tl, 1, 0, "sym fp64 real form tiles device");
            /* the fused tensor-core kernel through slabs (bulk operands converted once), state
               tiles (converted per call), the ring, the callback, float64 output */
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_TF32, QK_F32, QK_OUTPUT_DEVICE, 8, sl, 0, 1, 1, "sym tf32 fused device slabs");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP16, QK_F32, QK_OUTPUT_HOST, 10, sl, tl, 1, 0, "sym fp16 fused tiles resident");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_HOST, 9, sl, tl, 0, 2, "sym fp32x3 fused tiles ring");
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_TF32, QK_F64, QK_OUTPUT_CALLBACK, 8, sl, tl, 1, 0, "rect tf32 fused tiles callback f64out");
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, sl, 0, 1, 0, "rect fp32x3 fused device slabs");
        }
    }
}

/* Tensor-core engines on diagonal blocks of several row blocks (qk__tc_products covers the upper
   triangle of an m x m block with blocks of at least 512 rows): m = 1100 and 700-row slabs, on a
   complex and a real map. */
static void tc_block_tests()
{
    for (int real = 0; real < 2; ++real) {
        TMap t = real ? map_hea(7, 2, 'y', false) : map_zz(7, 2, true);
        t.finish();
        const size_t D = (size_t)1 << t.q;
        const int64_t nx = 1100, ny = 300;
        std::vector<double> xa = rand_x(t, nx), xb = rand_x(t, ny);
        std::vector<cd> SA(nx * D), SB(ny * D);
        for (int64_t s = 0; s < nx; ++s) ref_state(t, &xa[s * t.d], &SA[s * D]);
        for (int64_t s = 0; s < ny; ++s) ref_state(t, &xb[s * t.d], &SB[s * D]);
        const int before = qk_test_fails;
        static const struct { qk_precision p; int b; } tcm[] = {
            {QK_PRECISION_TF32, 3}, {QK_PRECISION_FP32X3, 4}, {QK_PRECISION_FP16, 5}, {QK_PRECISION_FP64, 7},
            /* the fused tensor-core kernel: many tiles of the triangular grid (1100 rows: 9 tiles
               of 128 a side), slabs of 700 rows (a diagonal block not at the origin: the full
               grid with the below-diagonal tiles skipped), every configuration in turn */
            {QK_PRECISION_TF32, 8}, {QK_PRECISION_FP32X3, 9}, {QK_PRECISION_FP16, 10}};
        for (auto &c : tcm)
            for (g_cfg = 0; g_cfg <= (c.b >= 8 ? 4 : 0); g_cfg = c.b >= 8 ? tcf_next(g_cfg, 3) : 99) {
                const qk_dtype od = c.p == QK_PRECISION_FP64 ? QK_F64 : QK_F32;
                if (getenv("QK_TEST_ONLY")) { printf("tc blocks %s engine %d cfg %d\n", t.name.c_str(), c.b, g_cfg); fflush(stdout); }
                /* complex states on the cuBLAS engines 3..5: Gauss's three products for every slab
                   (qk_cuda_test_gauss), and again under QK_TC_4M=1 in the real form (none) */
                for (int m4 = 0; m4 < (!real && c.b >= 3 && c.b <= 5 ? 2 : 1); ++m4) {
                    if (m4) setenv("QK_TC_4M", "1", 1);
                    const int g0 = qk_cuda_test_gauss();
                    char w[3][64];
                    snprintf(w[0], sizeof w[0], "blocks sym device%s", m4 ? " 4M" : "");
                    snprintf(w[1], sizeof w[1], "blocks sym slabs 700%s", m4 ? " 4M" : "");
                    snprintf(w[2], sizeof w[2], "blocks rect%s", m4 ? " 4M" : "");
                    check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, od, QK_OUTPUT_DEVICE, c.b, 2048, 0, 1, 0, w[0]);
                    check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, od, QK_OUTPUT_HOST, c.b, 700, 0, 1, 1, w[1]);
                    check_gram(t, SA, SB, xa, xb, nx, ny, false, c.p, od, QK_OUTPUT_HOST, c.b, 2048, 0, 1, 0, w[2]);
                    const int ng = qk_cuda_test_gauss() - g0;
                    if (m4) unsetenv("QK_TC_4M");
                    const bool want = !real && c.b >= 3 && c.b <= 5 && !m4;
                    CHECK(want ? ng >= 3 : ng == 0, "tc blocks %s engine %d%s: %d slabs in Gauss's form, expected %s", t.name.c_str(), c.b,
                          m4 ? " QK_TC_4M" : "", ng, want ? "3 or more" : "none");
                }
            }
        /* the cuBLAS paths with their C poisoned (NaN) before the GEMMs: K must stay finite and
           within its bound, i.e. every entry the |.|^2 epilogue reads was written by a GEMM
           (issue 27 item 13: initcheck reports reads in this epilogue that fresh zeroed memory
           would mask) */
        static const struct { qk_precision p; int b; } pm[] = {
            {QK_PRECISION_FP32, 1}, {QK_PRECISION_FP32, 2}, {QK_PRECISION_FP64, 1}, {QK_PRECISION_TF32, 3},
            {QK_PRECISION_FP32X3, 4}, {QK_PRECISION_FP16, 5}, {QK_PRECISION_FP64, 7}};
        qk_cuda_test_poison_gemm(1);
        for (auto &c : pm) {
            const qk_dtype od = c.p == QK_PRECISION_FP64 ? QK_F64 : QK_F32;
            if (real && c.b == 2) continue; /* CGEMM3M: complex only */
            check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, od, QK_OUTPUT_DEVICE, c.b, 2048, 0, 1, 0, "poisoned C sym device");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, c.p, od, QK_OUTPUT_HOST, c.b, 700, 0, 1, 1, "poisoned C sym slabs 700");
            check_gram(t, SA, SB, xa, xb, nx, ny, false, c.p, od, QK_OUTPUT_HOST, c.b, 2048, 0, 1, 0, "poisoned C rect");
        }
        qk_cuda_test_poison_gemm(getenv("QK_TEST_POISON") != NULL);
        g_cfg = 0;
        printf("tensor-core blocks %-10s %s\n", t.name.c_str(), qk_test_fails == before ? "ok" : "FAILED");
    }
}

/* The persistent few-qubit kernels (fused configuration 7, SIMT, q <= 5; 8, tensor cores,
   2 <= q <= 6; each the fixed table's choice somewhere) on sizes with full interior 128 x 128
   tiles (the 16- and 8-byte store and mirror paths: ld a multiple of 4) and partial ones (n =
   645: 5 full tiles and 5 rows; ld = n + 3 = 648), square and rectangular, device and host
   slabs (slab rows not a multiple of 128: doff), and state tiles of 301 rows. */
/* The fp16, bf16 and fp32x3 engines' operand planes written by the state builder (bulk states of
   a map, Gauss's form), through every builder: mix at 10 qubits (the generic pass), zz at 13 (one
   structured pass), zz at 14 under QK_STATES_OLD=1 (two structured passes: the last one writes
   them), zz at 14 and 16 (the fused kernel on compute capability 9.0 or later, else the two
   passes). For a symmetric job on the device, one on the host in slabs of 64 rows (diagonal blocks
   off the origin, two workspace slots) and two rectangular ones (one slab; slabs of 16 rows): K
   within its bound of the float64 reference and bitwise equal to the same job with the operand
   pass (QK_TC_PLANES=0: the same roundings, the same GEMMs); the builds that wrote planes counted:
   some with them on, except fp32x3's rectangle in slabs of 16, whose two small workspace slots
   save less than its planes take (none there); none with them off. zz at 14 once more with C
   poisoned. only: the qubit counts to run (QK_TEST_ONLY=planes test_gpu_engine QMAX API QLIST), or
   empty for all. */
static void planes_tests(const std::vector<int> &only = {})
{
    const int before = qk_test_fails;
    struct Cfg { int q; bool mix, old, poison; } cfgs[] = {{10, true, false, false}, {13, false, false, false}, {14, false, true, false},
                                                        {14, false, false, true}, {16, false, false, false}};
    for (const Cfg &cf : cfgs) {
        const int q = cf.q;
        if (!only.empty() && std::find(only.begin(), only.end(), q) == only.end()) continue;
        TMap t = cf.mix ? map_mix(q) : map_zz(q, 2, true);
        const size_t D = (size_t)1 << q;
        const int64_t nx = q <= 14 ? 150 : 70, ny = q <= 14 ? 45 : 5;
        std::vector<double> xa = rand_x(t, nx), xb = rand_x(t, ny);
        std::vector<cd> SA(nx * D), SB(ny * D);
        for (int64_t s = 0; s < nx; ++s) ref_state(t, &xa[s * t.d], &SA[s * D]);
        for (int64_t s = 0; s < ny; ++s) ref_state(t, &xb[s * t.d], &SB[s * D]);
        if (cf.old) setenv("QK_STATES_OLD", "1", 1);
        for (int b : {5, 6, 4})
            for (int poison = 0; poison < (cf.poison ? 2 : 1); ++poison) {
                qk_cuda_test_poison_gemm(poison);
                const qk_precision prec = b == 4 ? QK_PRECISION_FP32X3 : QK_PRECISION_FP16;
                const char *en = b == 5 ? "fp16" : b == 6 ? "bf16" : "fp32x3";
                for (int c = 0; c < 4; ++c) {
                    const bool sym = c < 2;
                    const qk_output out = c == 0 ? QK_OUTPUT_DEVICE : QK_OUTPUT_HOST;
                    const int64_t slab = c == 1 ? 64 : c == 3 ? 16 : 2048, nyc = sym ? nx : ny;
                    std::vector<unsigned char> k[2];
                    int np[2];
                    for (int off = 0; off < 2; ++off) {
                        char w[128];
                        snprintf(w, sizeof w, "planes %s %s%s%s%s", en, c == 0 ? "sym device" : c == 1 ? "sym slabs 64" : c == 2 ? "rect" : "rect slabs 16",
                                 cf.old ? " QK_STATES_OLD" : "", poison ? " poisoned C" : "", off ? " QK_TC_PLANES=0" : "");
                        if (off) setenv("QK_TC_PLANES", "0", 1);
                        const int p0 = qk_cuda_test_planes();
                        check_gram(t, SA, SB, xa, xb, nx, nyc, sym, prec, QK_F32, out, b, slab, 0, 1, 0, w, &k[off]);
                        np[off] = qk_cuda_test_planes() - p0;
                        if (off) unsetenv("QK_TC_PLANES");
                    }
                    const bool want = !(b == 4 && c == 3);
                    CHECK(want ? np[0] >= 1 : np[0] == 0, "planes %s q=%d %s case %d: %d builds wrote planes, expected %s", t.name.c_str(), q, en,
                          c, np[0], want ? "some" : "none");
                    CHECK(np[1] == 0, "planes %s q=%d %s case %d: %d builds wrote planes under QK_TC_PLANES=0", t.name.c_str(), q, en, c, np[1]);
                    CHECK(k[0].size() == k[1].size() && !memcmp(k[0].data(), k[1].data(), k[0].size()),
                          "planes %s q=%d %s case %d%s: K differs from the operand pass's", t.name.c_str(), q, en, c, poison ? " (poisoned C)" : "");
                }
            }
        if (cf.old) unsetenv("QK_STATES_OLD");
    }
    qk_cuda_test_poison_gemm(getenv("QK_TEST_POISON") != NULL);
    printf("operand planes from the state builder %s\n", qk_test_fails == before ? "ok" : "FAILED");
}

static void small_kernel_tests()
{
    for (int q = 2; q <= 6; ++q) {
        TMap t = map_zz(q, 2, true);
        t.finish();
        const size_t D = (size_t)1 << t.q;
        const int64_t nx = 645, ny = 391;
        std::vector<double> xa = rand_x(t, nx), xb = rand_x(t, ny);
        std::vector<cd> SA(nx * D), SB(ny * D);
        for (int64_t s = 0; s < nx; ++s) ref_state(t, &xa[s * t.d], &SA[s * D]);
        for (int64_t s = 0; s < ny; ++s) ref_state(t, &xb[s * t.d], &SB[s * D]);
        const int before = qk_test_fails;
        /* configuration 8 at 4 qubits takes the warp-pipelined form (qk__k_gram_stw) on devices
           its rule names (pass 8), always under QK_STC_WARP=1 (pass 10), never under QK_STC_OLD=1
           (pass 9: the block form) */
        for (int pass = 7; pass <= 10; ++pass) {
            g_cfg = pass > 8 ? 8 : pass;
            if (g_cfg == 7 && q > 5) continue;
            if (pass >= 9 && q != 4) continue;
            char w[7][80];
            static const char *what[7] = {"sym device ld+3", "sym device ld=n", "rect device", "sym slabs 300",
                                          "sym ring", "rect f64out (falls back)", "sym state tiles 301"};
            const char *sw_env = pass == 9 ? "QK_STC_OLD" : pass == 10 ? "QK_STC_WARP" : nullptr;
            for (int k = 0; k < 7; ++k) snprintf(w[k], sizeof w[k], "small cfg %d%s%s %s", g_cfg, sw_env ? " " : "", sw_env ? sw_env : "", what[k]);
            if (sw_env) setenv(sw_env, "1", 1);
            const int sw0 = qk_cuda_test_small_warp();
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, 2048, 0, 1, 3, w[0]);
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, 2048, 0, 1, 0, w[1]);
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, 2048, 0, 1, 1, w[2]);
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, 300, 0, 1, 3, w[3]);
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, 300, 0, 0, 0, w[4]);
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32, QK_F64, QK_OUTPUT_HOST, 0, 2048, 0, 1, 0, w[5]);
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST, 0, 2048, 301, 1, 0, w[6]);
            const int sw = qk_cuda_test_small_warp() - sw0;
            if (sw_env) unsetenv(sw_env);
            /* every call but the float64 K's runs it (device, slabs, ring, state tiles) */
            const bool want_sw = q == 4 && (pass == 10 || (pass == 8 && qk_cuda_test_small_warp_default()));
            CHECK(want_sw ? sw >= 6 : sw == 0, "small cfg %d q=%d %s: %d warp-pipelined launches, expected %s", g_cfg, q,
                  sw_env ? sw_env : "(default)", sw, want_sw ? "6 or more" : "none");
            if (pass == 8 && q == 4) printf("configuration 8 at 4 qubits: %s form by default\n", qk_cuda_test_small_warp_default() ? "warp-pipelined" : "block");
        }
        /* the TMA-fed fp32x3 kernel (qk__k_wg3t; configuration 4 forced), from 5 qubits the
           default on wgmma devices, at one 32-word stage (2 to 5 qubits: the zero-padded words
           of short states) and two (6): partial tiles at the last panel's rows and the last
           tile's columns, n = 644 and 645, ld = n and padded, device and host K */
        if (wg_ok()) {
            g_cfg = 4;
            const int64_t n4 = 644, m4 = 388;   /* (at most the 645 x 391 samples drawn above) */
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 3, "wg3t sym device 645 ld+3");
            check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 0, "wg3t sym device 645 ld=n");
            check_gram(t, SA, SB, xa, xb, n4, n4, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 4, "wg3t sym device 644 ld+4");
            check_gram(t, SA, SB, xa, xb, n4, n4, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 0, "wg3t sym device 644 ld=n");
            check_gram(t, SA, SB, xa, xb, n4, m4, false, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 0, "wg3t rect 644x388 device");
            check_gram(t, SA, SB, xa, xb, nx, ny, false, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_DEVICE, 9, 2048, 0, 1, 1, "wg3t rect 645x391 device");
            check_gram(t, SA, SB, xa, xb, n4, n4, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_HOST, 9, 300, 0, 1, 0, "wg3t sym 644 slabs 300");
            check_gram(t, SA, SB, xa, xb, n4, n4, true, QK_PRECISION_FP32X3, QK_F32, QK_OUTPUT_HOST, 9, 2048, 0, 0, 0, "wg3t sym 644 host ring");
            check_gram(t, SA, SB, xa, xb, n4, n4, true, QK_PRECISION_FP32X3, QK_F64, QK_OUTPUT_HOST, 9, 2048, 0, 1, 0, "wg3t sym 644 f64 out");
        }
        g_cfg = 0;
        check_gram(t, SA, SB, xa, xb, nx, nx, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_DEVICE, 0, 2048, 0, 1, 3, "fixed table sym device");
        printf("persistent few-qubit kernels %-10s %s\n", t.name.c_str(), qk_test_fails == before ? "ok" : "FAILED");
    }
}

/* The engine runs the job its plan was made for: a desc of another size, symmetry or output is
   refused with a clear error and K untouched (the engine no longer re-derives the job from the
   desc). */
static void plan_mismatch_tests()
{
    TMap t = map_zz(4, 2, true);
    t.finish();
    const int64_t n = 100;
    std::vector<double> x = rand_x(t, n + 1), y = rand_x(t, 7);
    std::vector<float> K((size_t)(n + 1) * (n + 1), 7.0f);
    struct { int64_t nx; bool y; qk_output out; const char *what; } cs[] = {
        {n + 1, false, QK_OUTPUT_HOST, "n_x"}, {n, true, QK_OUTPUT_HOST, "K(X,Y) desc, K(X,X) plan"},
        {n, false, QK_OUTPUT_CALLBACK, "output"}};
    for (auto &c : cs) {
        qk_plan p = make_plan(t, n, n, true, QK_PRECISION_FP32, QK_F32, QK_OUTPUT_HOST);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = c.nx; g.out = K.data(); g.out_dtype = QK_F32; g.output = c.out; g.precision = QK_PRECISION_FP32;
        if (c.y) { g.y = y.data(); g.n_y = 7; }
        const qk_result r = qk__plan_run(NULL, &p, &t.m, &g, NULL);
        bool untouched = true;
        for (float v : K) untouched = untouched && v == 7.0f;
        CHECK(r == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "another job") && untouched,
              "plan for another job (%s): -> %d (%s), K %s", c.what, (int)r, qk_last_error(), untouched ? "untouched" : "written");
    }
    printf("plan / desc mismatch refused\n");
}

/* FP32 through the public API is the FP32 engine of before (the fixed table's fused kernel or
   cuBLAS HERK/SYRK): bitwise the same K as a plan that names that engine. */
static void fp32_same_tests(qk_ctx *gpu)
{
    const int f0 = qk_test_fails;   /* this part's failures only, in the line below */
    const char *specs[] = {"zz(reps=2)", "zz(reps=2)", "hea(layers=2)"};
    const int dims[] = {5, 8, 9};
    for (int i = 0; i < 3; ++i) {
        qk_map *m = nullptr;
        CHECK(qk_map_parse(specs[i], dims[i], &m) == QK_OK, "fp32 same: parse");
        if (!m) continue;
        const int64_t n = 501;
        std::vector<double> x((size_t)n * dims[i]);
        for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
        std::vector<float> k1((size_t)n * n, NAN), k2((size_t)n * n, NAN);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n; g.out = k1.data(); g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32;
        CHECK(qk_gram(gpu, m, &g) == QK_OK, "fp32 same %s: %s", specs[i], qk_last_error());
        qk_plan p;
        memset(&p, 0, sizeof p);
        p.backend = QK_BACKEND_CUDA; p.path = m->cls == QK_CLASS_REAL ? QK_PATH_REAL : QK_PATH_COMPLEX;
        p.precision = QK_PRECISION_FP32; p.out_dtype = QK_F32; p.output = QK_OUTPUT_HOST; p.n_qubits = dims[i];
        p.n_x = n; p.n_y = n; p.symmetric = 1; p.bulk_states = 1; p.tile_m = n; p.k_resident = 1; p.n_streams = 2;
        p.engine = dims[i] >= 7 ? QK_GPU_CUBLAS : QK_GPU_FUSED;
        g.out = k2.data();
        CHECK(qk__plan_run(NULL, &p, m, &g, NULL) == QK_OK, "fp32 same %s: %s", specs[i], qk_last_error());
        CHECK(memcmp(k1.data(), k2.data(), k1.size() * 4) == 0, "fp32 same %s q=%d: K differs from the fp32 engine's (blas %d)",
              specs[i], dims[i], (int)p.engine);
        qk_map_free(m);
    }
    printf("fp32 engine unchanged %s\n", qk_test_fails > f0 ? "FAILED" : "ok");
}

/* ---- precision AUTO through the public API: the mode the planner names, K within its stated
   bound (plan.error_bound, qk_precision_error_bound) against the CPU engine ---- */
static void auto_tests(qk_ctx *cpu, qk_ctx *gpu)
{
    static const struct { const char *spec; int d; double tol; qk_precision want; } cs[] = {
        {"zz(reps=2)", 8, 0.0, QK_PRECISION_FP32X3}, {"zz(reps=2)", 8, 1e-3, QK_PRECISION_FP32X3},
        {"zz(reps=2)", 8, 1e-2, QK_PRECISION_FP16}, {"hea(layers=2)", 9, 1e-2, QK_PRECISION_FP16},
        {"iqp", 7, 1e-3, QK_PRECISION_FP32X3}, {"zz(reps=1)", 12, 1e-2, QK_PRECISION_FP16}};
    for (auto &c : cs) {
        qk_map *m = nullptr;
        if (qk_map_parse(c.spec, c.d, &m) != QK_OK) { CHECK(false, "auto: parse %s", c.spec); continue; }
        const int64_t n = c.d >= 12 ? 131 : 333;
        std::vector<double> x((size_t)n * c.d), ref((size_t)n * n), got((size_t)n * n, NAN);
        for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n; g.out = ref.data(); g.out_dtype = QK_F64;
        CHECK(qk_gram(cpu, m, &g) == QK_OK, "auto: cpu %s", qk_last_error());
        g.out = got.data();
        g.precision = QK_PRECISION_AUTO;
        g.tol = c.tol;
        qk_plan p;
        CHECK(qk_plan_make(gpu, m, &g, &p) == QK_OK && p.precision == c.want && strstr(p.precision_note, "auto"),
              "auto %s d=%d tol %g: %s '%s'", c.spec, c.d, c.tol, qk_precision_name(p.precision), p.precision_note);
        CHECK(qk_gram(gpu, m, &g) == QK_OK, "auto %s: %s", c.spec, qk_last_error());
        double e = 0;
        for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::isnan(got[i]) ? INFINITY : fabs(got[i] - ref[i]));
        CHECK(e <= p.error_bound, "auto %s d=%d tol %g (%s, blas %d): max err %.3g > stated bound %.3g", c.spec, c.d, c.tol,
              qk_precision_name(p.precision), (int)p.engine, e, p.error_bound);
        printf("auto %-14s d=%2d tol %-6g -> %-6s blas %2d: max err %.2g (bound %.2g)\n", c.spec, c.d, c.tol, qk_precision_name(p.precision),
               (int)p.engine, e, p.error_bound);
        qk_map_free(m);
    }
}

/* The GPU default (QK_PRECISION_DEFAULT, tol 0: auto at fp32-class, fp32x3 where the tensor cores
   apply: from 7 qubits, from 5 for complex states on wgmma devices) on every map family at 5, 6,
   7, 8, 12 and 16 qubits: the mode it takes, and its measured error
   against the CPU engine's fp64 K within fp32's own bound, the promise docs/precision.md made for
   the default before it took fp32x3 (and within the plan's stated bound). */
static void default_precision_tests(qk_ctx *cpu, qk_ctx *gpu)
{
    static const char *const fam[] = {"zz(reps=2)", "zz(reps=1,ent=linear)", "iqp", "hea(layers=2)", "hea(layers=1,rot=yz)",
                                      "amplitude", "angle", "basis", "circuit"};
    static const int qs[] = {5, 6, 7, 8, 12, 16};
    for (const char *fspec : fam) {
        for (int q : qs) {
            /* circuit: a custom map of every gate kind over q qubits */
            std::string cs;
            if (!strcmp(fspec, "circuit")) {
                cs = "circuit(qubits=" + std::to_string(q) + ":";
                for (int k = 0; k < q; ++k) cs += " h(" + std::to_string(k) + ") ry(" + std::to_string(k) + ", x" + std::to_string(k) + ")";
                for (int k = 0; k + 1 < q; ++k)
                    cs += " cx(" + std::to_string(k) + "," + std::to_string(k + 1) + ") rz(" + std::to_string(k + 1) + ", x" + std::to_string(k) +
                          "*x" + std::to_string(k + 1) + ") cz(" + std::to_string(k) + "," + std::to_string(k + 1) + ") rx(" + std::to_string(k) +
                          ", 0.5*x" + std::to_string(k + 1) + "+0.1) rzz(0," + std::to_string(k + 1) + ", -1.5*x" + std::to_string(k) + ")";
                cs += ")";
            }
            const char *spec = cs.empty() ? fspec : cs.c_str();
            const bool amp = strncmp(spec, "amplitude", 9) == 0, basis = strncmp(spec, "basis", 5) == 0;
            const int d = amp ? (1 << q) - 3 : q; /* amplitude: 2^q - 3 features pad to q qubits */
            qk_map *m = nullptr;
            if (qk_map_parse(spec, d, &m) != QK_OK) { CHECK(false, "default: parse %s d=%d: %s", fspec, d, qk_last_error()); continue; }
            const int64_t n = q >= 12 ? 97 : 301;
            std::vector<double> x((size_t)n * d), ref((size_t)n * n), got((size_t)n * n, NAN);
            for (auto &v : x) v = basis ? (double)(qk_test_rand64() & 1) : amp ? qk_test_uniform(-1, 1) : qk_test_uniform(0, 2 * M_PI);
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = n; g.out = ref.data(); g.out_dtype = QK_F64;
            CHECK(qk_gram(cpu, m, &g) == QK_OK, "default %s: cpu %s", fspec, qk_last_error());
            g.out = got.data();
            g.precision = QK_PRECISION_DEFAULT;
            qk_plan p;
            CHECK(qk_plan_make(gpu, m, &g, &p) == QK_OK, "default %s q=%d: plan %s", fspec, q, qk_last_error());
            /* product maps (analytic) and the MPS path (the planner's choice for low-bond maps at
               12-16 qubits) have no tensor-core mode: fp32 */
            const bool product = m->cls == QK_CLASS_PRODUCT, mps = p.path == QK_PATH_MPS;
            const bool tcq = q >= 7 || (q >= 5 && wg_ok() && p.path == QK_PATH_COMPLEX);   /* fp32x3 on the tensor cores */
            CHECK(p.precision == (product || mps || !tcq ? QK_PRECISION_FP32 : QK_PRECISION_FP32X3) && strstr(p.precision_note, "default") &&
                  p.error_bound > 0,
                  "default %s q=%d: %s '%s'", fspec, q, qk_precision_name(p.precision), p.precision_note);
            CHECK(qk_gram(gpu, m, &g) == QK_OK, "default %s q=%d: %s", fspec, q, qk_last_error());
            double e = 0;
            for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::isnan(got[i]) ? INFINITY : fabs(got[i] - ref[i]));
            const double promised = qk_precision_error_bound(QK_PRECISION_FP32, q);
            CHECK(e <= promised && e <= p.error_bound, "default %s q=%d (%s, blas %d): max err %.3g > fp32's bound %.3g / stated %.3g", fspec, q,
                  qk_precision_name(p.precision), (int)p.engine, e, promised, p.error_bound);
            printf("default %-30s q=%2d -> %-6s %s blas %2d: max err %.2g (stated %.2g, fp32's bound %.2g)\n", fspec, q,
                   qk_precision_name(p.precision), mps ? "mps" : "sv ", (int)p.engine, e, p.error_bound, promised);
            qk_map_free(m);
        }
    }
}

/* ---- public API: CUDA context vs CPU context ---- */
static void api_case(qk_ctx *cpu, qk_ctx *gpu, const char *spec, int d, int64_t nx, int64_t ny, qk_precision prec,
                     qk_output out, bool binary)
{
    qk_map *m = nullptr;
    qk_result r = qk_map_parse(spec, d, &m);
    CHECK(r == QK_OK, "api %s: qk_map_parse -> %d %s", spec, (int)r, qk_last_error());
    if (r != QK_OK) return;
    std::vector<double> x((size_t)nx * d), y((size_t)ny * d);
    for (auto &v : x) v = binary ? (double)(qk_test_rand64() & 1) : qk_test_uniform(-0.5, 2 * M_PI);
    for (auto &v : y) v = binary ? (double)(qk_test_rand64() & 1) : qk_test_uniform(-0.5, 2 * M_PI);
    if (!binary) { x[0] = 1.0; y[0] = 1.0; } /* amplitude: no zero rows */
    for (int sym = 0; sym < 2; ++sym) {
        const int64_t cols = sym ? nx : ny;
        std::vector<double> ref((size_t)nx * cols, NAN), got((size_t)nx * cols, NAN);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = nx;
        if (!sym) { g.y = y.data(); g.n_y = ny; }
        g.out_dtype = QK_F64;
        g.out = ref.data();
        r = qk_gram(cpu, m, &g);
        CHECK(r == QK_OK, "api %s: cpu qk_gram -> %d %s", spec, (int)r, qk_last_error());
        g.precision = prec;
        void *dptr = nullptr;
        if (out == QK_OUTPUT_DEVICE) { cudaMalloc(&dptr, got.size() * 8); cudaMemset(dptr, 0xff, got.size() * 8); g.out = dptr; }
        else g.out = got.data();
        g.output = out;
        qk_plan plan;
        r = qk_plan_make(gpu, m, &g, &plan);
        CHECK(r == QK_OK && plan.backend == QK_BACKEND_CUDA, "api %s: plan -> %d backend %d", spec, (int)r, (int)plan.backend);
        r = qk_gram(gpu, m, &g);
        CHECK(r == QK_OK, "api %s: cuda qk_gram -> %d %s", spec, (int)r, qk_last_error());
        if (dptr) { cudaMemcpy(got.data(), dptr, got.size() * 8, cudaMemcpyDeviceToHost); cudaFree(dptr); }
        const double tabs = prec == QK_PRECISION_FP64 ? 1e-10 : 1e-4 * (1 + m->n_qubits / 4.0) + ldexp(1.0, m->n_qubits - 24) / 4 + op_bound(plan.engine);
        int64_t bad = 0;
        double maxerr = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            double e = fabs(got[i] - ref[i]);
            if (!(e <= tabs + 1e-6 * fabs(ref[i]))) bad++;
            if (!(e <= maxerr)) maxerr = std::isnan(e) ? INFINITY : e;
        }
        CHECK(bad == 0, "api %s %s %s out=%d: %lld of %zu off, max err %.3g (plan: %s)", spec, sym ? "K(X,X)" : "K(X,Y)",
              engine_name(prec, plan.engine), (int)out, (long long)bad, got.size(), maxerr, plan.config);
        CHECK(plan.precision == prec, "api %s: plan precision %d, asked %d", spec, (int)plan.precision, (int)prec);
    }
    qk_map_free(m);
}

static void api_tests()
{
    qk_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.autotune = -1; /* the fixed table here; the autotune part below tunes into a temp cache */
    qk_ctx *cpu = nullptr, *gpu = nullptr;
    CHECK(qk_ctx_create(&cd, &cpu) == QK_OK, "cpu ctx: %s", qk_last_error());
    cd.device = QK_DEVICE_CUDA;
    CHECK(qk_ctx_create(&cd, &gpu) == QK_OK, "cuda ctx: %s", qk_last_error());
    if (!cpu || !gpu) return;
    struct { const char *spec; int d; bool bin; } maps[] = {
        {"zz(reps=2,ent=full)", 5, false}, {"zz(reps=1,ent=linear)", 7, false}, {"zz(reps=2,ent=circular)", 9, false},
        {"zz(reps=2,ent=sca)", 6, false}, {"iqp(reps=2)", 6, false}, {"angle(rot=y)", 11, false}, {"amplitude", 37, false},
        {"basis", 10, true}, {"hea(layers=2,rot=y,ent=cz)", 8, false}, {"hea(layers=3,rot=yz,ent=cnot)", 7, false},
        {"zz(reps=2)", 14, false}, {"angle(rot=x)", 300, false},
        /* the parity rule (qk__parity_at): CX D CX with D = Z, RZ, P, and near misses, on the
           CPU's one-pass (5 qubits) and folded-run (13) paths, against the GPU compiler's */
        {"circuit(qubits=5: h(0) h(1) h(2) h(3) h(4) ry(4, x3) cx(0,1) z(1) cx(0,1) cx(2,1) rz(1, x0) cx(2,1) cx(1,3) "
         "p(3, x1*x2) cx(1,3) cx(0,1) rz(0, x0) cx(0,1) cx(1,2) p(2, x1) cx(2,1) cx(2,3) rx(3, x2) cx(2,3) cx(4,2) p(2, x3))", 4, false},
        {"circuit(qubits=13: h(0) h(1) h(2) h(3) h(4) h(5) h(6) h(7) h(8) h(9) h(10) h(11) h(12) ry(12, x3) cx(0,1) z(1) cx(0,1) "
         "cx(2,1) rz(1, x0) cx(2,1) cx(1,12) p(12, x1*x2) cx(1,12) cx(3,4) rz(3, x0) cx(3,4) rz(5, x2) cx(11,10) rz(10, x1) cx(11,10))", 4, false},
    };
    for (auto &mm : maps) {
        int before = qk_test_fails;
        int64_t nx = mm.d >= 14 ? 45 : 301, ny = mm.d >= 14 ? 23 : 77;
        api_case(cpu, gpu, mm.spec, mm.d, nx, ny, QK_PRECISION_FP32, QK_OUTPUT_HOST, mm.bin);
        api_case(cpu, gpu, mm.spec, mm.d, nx, ny, QK_PRECISION_FP64, QK_OUTPUT_DEVICE, mm.bin);
        api_case(cpu, gpu, mm.spec, mm.d, nx, ny, QK_PRECISION_TF32, QK_OUTPUT_HOST, mm.bin);
        api_case(cpu, gpu, mm.spec, mm.d, nx, ny, QK_PRECISION_FP32X3, QK_OUTPUT_DEVICE, mm.bin);
        api_case(cpu, gpu, mm.spec, mm.d, nx, ny, QK_PRECISION_FP16, QK_OUTPUT_HOST, mm.bin);
        printf("api %-32s %s\n", mm.spec, qk_test_fails == before ? "ok" : "FAILED");
    }
    auto_tests(cpu, gpu);
    default_precision_tests(cpu, gpu);
    /* autotune: measure and store into a fresh cache directory, then a second context reads it */
    char dir[] = "/tmp/qk-gpu-test-XXXXXX";
    if (mkdtemp(dir)) {
        qk_ctx *t1 = nullptr, *t2 = nullptr;
        qk_ctx_desc td = cd;
        td.device = QK_DEVICE_CUDA;
        td.autotune = 1;
        td.cache_dir = dir;
        CHECK(qk_ctx_create(&td, &t1) == QK_OK, "tune ctx: %s", qk_last_error());
        td.autotune = 0;
        CHECK(qk_ctx_create(&td, &t2) == QK_OK, "tune ctx 2: %s", qk_last_error());
        qk_map *m = nullptr;
        if (t1 && t2 && qk_map_parse("zz(reps=2)", 7, &m) == QK_OK) {
            std::vector<double> x(300 * 7);
            for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
            std::vector<float> k1(300 * 300, NAN), k2(300 * 300, NAN);
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = 300; g.out = k1.data(); g.out_dtype = QK_F32;
            qk_plan p1, p2;
            CHECK(qk_plan_make(t1, m, &g, &p1) == QK_OK && strncmp(p1.config, "tuned (measured)", 16) == 0, "autotune measure: '%s'", p1.config);
            CHECK(qk_plan_make(t2, m, &g, &p2) == QK_OK && strncmp(p2.config, "tuned (cache)", 13) == 0 &&
                  p2.engine == p1.engine && p2.kernel_cfg == p1.kernel_cfg, "autotune cache: '%s' vs '%s'", p2.config, p1.config);
            CHECK(qk_gram(t2, m, &g) == QK_OK, "tuned gram: %s", qk_last_error());
            g.out = k2.data();
            CHECK(qk_gram(cpu, m, &g) == QK_OK, "cpu gram: %s", qk_last_error());
            double e = 0;
            for (size_t i = 0; i < k1.size(); ++i) e = std::max(e, (double)fabsf(k1[i] - k2[i]) + (std::isnan(k1[i]) ? 1.0 : 0.0));
            CHECK(e < 5e-4, "tuned gram vs cpu: max err %.3g", e);
            printf("autotune: %s\n", p1.config);
            /* a tensor-core precision: its own cache key; the engine chosen is one the precision
               admits (fp32 engines or its own), and K holds the mode's bound */
            g.precision = QK_PRECISION_TF32;
            g.out = k1.data();
            CHECK(qk_plan_make(t1, m, &g, &p1) == QK_OK && strncmp(p1.config, "tuned (measured)", 16) == 0 &&
                  (p1.engine <= QK_GPU_TC_TF32 || p1.engine == QK_GPU_TCF_TF32) && p1.precision == QK_PRECISION_TF32, "autotune tf32: engine %d '%s'", (int)p1.engine, p1.config);
            CHECK(qk_plan_make(t2, m, &g, &p2) == QK_OK && strncmp(p2.config, "tuned (cache)", 13) == 0 && p2.engine == p1.engine,
                  "autotune tf32 cache: '%s'", p2.config);
            CHECK(qk_gram(t2, m, &g) == QK_OK, "tuned tf32 gram: %s", qk_last_error());
            e = 0;
            for (size_t i = 0; i < k1.size(); ++i) e = std::max(e, (double)fabsf(k1[i] - k2[i]) + (std::isnan(k1[i]) ? 1.0 : 0.0));
            CHECK(e < 5e-4 + op_bound(p2.engine), "tuned tf32 gram vs cpu: max err %.3g", e);
            printf("autotune tf32: %s (engine %d)\n", p1.config, (int)p1.engine);
            /* the tuner's candidates in a tensor-core mode: its cuBLAS engine and the fused
               tensor-core kernel in configurations 1 and 2, each timed */
            g.precision = QK_PRECISION_FP16;
            CHECK(qk_plan_make(t1, m, &g, &p1) == QK_OK, "fp16 plan: %s", qk_last_error());
            {
                qk_cuda_tune_result tr;
                char terr[256] = "";
                int seen5 = 0, seen10 = 0;
                CHECK(qk_cuda_tune_gram(&p1, 2048, 1, &tr, terr, sizeof terr) == QK_OK, "tune fp16: %s", terr);
                for (int i = 0; i < tr.n; ++i) {
                    if (tr.blas[i] == QK_GPU_TC_FP16 && tr.ms[i] > 0) seen5++;
                    if (tr.blas[i] == QK_GPU_TCF_FP16 && (tr.cfg[i] == 1 || tr.cfg[i] == 2) && tr.ms[i] > 0) seen10++;
                }
                CHECK(seen5 == 1 && seen10 == 2 && tr.best >= 0 && tr.best < tr.n, "tune fp16 candidates: cuBLAS %d, fused tensor-core %d of %d",
                      seen5, seen10, tr.n);
            }
            CHECK(qk_gram(t1, m, &g) == QK_OK, "tuned fp16 gram: %s", qk_last_error());
            e = 0;
            for (size_t i = 0; i < k1.size(); ++i) e = std::max(e, (double)fabsf(k1[i] - k2[i]) + (std::isnan(k1[i]) ? 1.0 : 0.0));
            CHECK(e < 5e-4 + op_bound(p1.engine), "tuned fp16 gram vs cpu: max err %.3g (engine %d)", e, (int)p1.engine);
            printf("autotune fp16: %s (engine %d cfg %d)\n", p1.config, (int)p1.engine, p1.kernel_cfg);
        }
        if (m) qk_map_free(m);
        qk_ctx_destroy(t1);
        qk_ctx_destroy(t2);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) printf("could not remove %s\n", dir);
    }
    qk_ctx_destroy(cpu);
    qk_ctx_destroy(gpu);
}

/* ---- amplitude encoding from host data ---- */
static void amp_encode_tests()
{
    for (int pinned = 0; pinned < 2; ++pinned)
        for (int p64 = 0; p64 < 2; ++p64) {
            const int64_t n = 150; const int d = 37, q = 6; const int64_t D = 64;
            double *x = nullptr;
            std::vector<double> xv;
            if (pinned) cudaMallocHost((void **)&x, n * d * sizeof(double));
            else { xv.resize(n * d); x = xv.data(); }
            for (int64_t i = 0; i < n * d; ++i) x[i] = qk_test_uniform(-1, 1);
            const size_t es = p64 ? 8 : 4;
            void *dout = nullptr;
            cudaMalloc(&dout, n * D * es);
            cudaMemset(dout, 0xff, n * D * es); /* NaN poison */
            char err[256] = "";
            double sec = 0;
            qk_result r = qk_cuda_amplitude_encode(x, n, d, q, p64 ? QK_PRECISION_FP64 : QK_PRECISION_FP32, dout, 16, &sec, err, sizeof err);
            CHECK(r == QK_OK, "amplitude_encode: %d %s", (int)r, err);
            std::vector<unsigned char> h(n * D * es);
            cudaMemcpy(h.data(), dout, h.size(), cudaMemcpyDeviceToHost);
            double maxerr = 0;
            for (int64_t i = 0; i < n; ++i) {
                double nrm = 0;
                for (int k = 0; k < d; ++k) nrm += x[i * d + k] * x[i * d + k];
                nrm = sqrt(nrm);
                for (int64_t k = 0; k < D; ++k) {
                    double ref = k < d ? x[i * d + k] / nrm : 0.0;
                    double v = p64 ? ((double *)h.data())[i * D + k] : ((float *)h.data())[i * D + k];
                    double e = fabs(v - ref);
                    if (!(e <= maxerr)) maxerr = std::isnan(e) ? INFINITY : e;
                }
            }
            CHECK(maxerr <= (p64 ? 1e-15 : 1e-7), "amplitude_encode pinned=%d fp64=%d: max err %.3g", pinned, p64, maxerr);
            cudaFree(dout);
            if (pinned) cudaFreeHost(x);
        }
    printf("amplitude_encode %s\n", qk_test_fails ? "FAILED" : "ok");
}

/* ---- streamed output (.npy), pageable and fresh host buffers, square callback tiles ---- */
/* The same K through every host-side output of a CUDA context: pinned buffer (the reference),
   touched pageable buffer, fresh (never touched) buffer, the .npy stream and the tile callback
   must agree bitwise (one plan, the same kernels); slabs forced small so that many slabs pass. */
struct TileRec { std::vector<float> K; int64_t ny; int calls, bad, nonsq; bool sym; int64_t side; };
static int tile_rec(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *tile, int64_t ld, void *user)
{
    TileRec *r = (TileRec *)user;
    r->calls++;
    if (r->sym && j0 < i0) r->bad++;
    if (m != r->side && i0 + m != (int64_t)(r->K.size() / r->ny)) r->nonsq++;
    if (n != m && j0 + n != r->ny) r->nonsq++;
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b) {
            float v = ((const float *)tile)[a * ld + b];
            r->K[(size_t)(i0 + a) * r->ny + j0 + b] = v;
            if (r->sym && i0 != j0) r->K[(size_t)(j0 + b) * r->ny + i0 + a] = v;
        }
    return 0;
}

static int cancel_after(int64_t done, int64_t total, void *user)
{
    (void)total;
    return done > 0 && ++*(int *)user >= 2;
}

/* The transposed output of qk_cuda_gram (qk_cuda_io.mirror_out / mrows: a rectangle's mirror on
   several GPUs) on one GPU: K(X,Y) to the host in slabs of 16 rows (the plan's slab set small), its
   rows through io.rows and its transpose through mrows (staged) or into a page-locked buffer
   (mirror_out, the plan made for a pinned output); the transpose must be the rows' exactly (the
   same floats, moved), float32 and float64. Then the refusals: a symmetric plan, a DEVICE output,
   mirror_out without a page-locked output, mrows with one, a short mirror_ld, the MPS path. */
struct MirrorRec {
    std::vector<double> *K, *T;
    int64_t cols, rows;
    size_t es;
};
/* rows i0 .. i0 + m of a rows callback (float or double, es bytes, ld apart) into K (cols wide) */
static void rows_into(std::vector<double> &K, int64_t cols, size_t es, int64_t i0, int64_t m, const void *r, int64_t ld)
{
    for (int64_t a = 0; a < m; ++a)
        for (int64_t j = 0; j < cols; ++j)
            K[(size_t)((i0 + a) * cols + j)] = es == 4 ? ((const float *)r)[a * ld + j] : ((const double *)r)[a * ld + j];
}
static qk_result mirror_rows_cb(int64_t i0, int64_t m, const void *r, int64_t ld, void *u)
{
    MirrorRec *c = (MirrorRec *)u;
    rows_into(*c->K, c->cols, c->es, i0, m, r, ld);
    return QK_OK;
}
static qk_result mirror_t_cb(int64_t i0, int64_t m, const void *t, int64_t ld, void *u)
{
    MirrorRec *c = (MirrorRec *)u;
    for (int64_t j = 0; j < c->cols; ++j)
        for (int64_t a = 0; a < m; ++a)
            (*c->T)[(size_t)(j * c->rows + i0 + a)] = c->es == 4 ? ((const float *)t)[j * ld + a] : ((const double *)t)[j * ld + a];
    return QK_OK;
}
static void mirror_io_tests(qk_ctx *gpu)
{
    qk_map *m = nullptr;
    if (qk_map_parse("zz(reps=2)", 5, &m) != QK_OK) { CHECK(false, "mirror io: parse"); return; }
    const int64_t nx = 101 + (int64_t)(qk_test_rand64() % 40), ny = 67 + (int64_t)(qk_test_rand64() % 30);
    std::vector<double> x((size_t)nx * 5), y((size_t)ny * 5);
    for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
    for (auto &v : y) v = qk_test_uniform(0, 2 * M_PI);
    char err[512];
    std::vector<double> ref((size_t)(nx * ny));   /* the CPU engine's K(X,Y), fp64 */
    {
        qk_ctx *cpu = qk_test_cpu_ctx(0);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = nx; g.y = y.data(); g.n_y = ny;
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.out = ref.data();
        CHECK(qk_gram(cpu, m, &g) == QK_OK, "mirror io: cpu: %s", qk_last_error());
        qk_ctx_destroy(cpu);
    }
    for (int f64 = 0; f64 < 2; ++f64)
        for (int pinned = 0; pinned < 2; ++pinned) {
            const size_t es = f64 ? 8 : 4;
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = nx; g.y = y.data(); g.n_y = ny;
            g.precision = f64 ? QK_PRECISION_FP64 : QK_PRECISION_FP32; g.out_dtype = f64 ? QK_F64 : QK_F32;
            std::vector<unsigned char> host((size_t)(nx * ny) * es);
            void *pk = nullptr, *pt = nullptr;
            if (pinned && (qk_cuda_host_alloc((size_t)(nx * ny) * es, &pk, err, sizeof err) != QK_OK ||
                           qk_cuda_host_alloc((size_t)(nx * ny) * es, &pt, err, sizeof err) != QK_OK)) { CHECK(false, "mirror io: pinned: %s", err); return; }
            g.output = QK_OUTPUT_HOST; g.out = pinned ? pk : host.data();
            qk_plan p;
            if (qk_plan_make(gpu, m, &g, &p) != QK_OK) { CHECK(false, "mirror io: plan: %s", qk_last_error()); continue; }
            CHECK(p.host_pinned == pinned, "mirror io: plan.host_pinned %d for a %s buffer", p.host_pinned, pinned ? "page-locked" : "pageable");
            p.tile_m = p.slab_rows = 16;   /* several slabs, the last one short */
            p.k_resident = 0;
            std::vector<double> K((size_t)(nx * ny), NAN), T((size_t)(nx * ny), NAN);
            MirrorRec rec{&K, &T, ny, nx, es};
            qk_cuda_io io;
            memset(&io, 0, sizeof io);
            io.rows = mirror_rows_cb; io.rows_user = &rec;
            if (pinned) { io.mirror_out = pt; io.mirror_ld = nx; memset(pt, 0xff, (size_t)(nx * ny) * es); }
            else { io.mrows = mirror_t_cb; io.mrows_user = &rec; }
            err[0] = 0;
            const qk_result r = qk_cuda_gram(&p, m, &g, &io, err, sizeof err);
            CHECK(r == QK_OK, "mirror io %s %s: %s", f64 ? "f64" : "f32", pinned ? "pinned" : "staged", err);
            if (pinned)
                for (int64_t i = 0; i < nx * ny; ++i) {
                    K[(size_t)i] = es == 4 ? ((const float *)pk)[i] : ((const double *)pk)[i];
                    T[(size_t)i] = es == 4 ? ((const float *)pt)[i] : ((const double *)pt)[i];
                }
            int64_t bad = 0, off = 0;
            for (int64_t i = 0; i < nx; ++i)
                for (int64_t j = 0; j < ny; ++j) {
                    const double k = K[(size_t)(i * ny + j)], t = T[(size_t)(j * nx + i)];
                    bad += !(k == t);
                    off += !(std::fabs(k - ref[(size_t)(i * ny + j)]) <= (f64 ? 1e-12 : 1e-4));
                }
            CHECK(r != QK_OK || (bad == 0 && off == 0), "mirror io %s %s: %lld transposed entries differ from the rows', %lld rows' entries from the CPU engine's",
                  f64 ? "f64" : "f32", pinned ? "pinned" : "staged", (long long)bad, (long long)off);
            if (pinned) {   /* the refusals that need a page-locked plan */
                io.mirror_ld = nx - 1;
                CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "mirror_ld"), "short mirror_ld: %s", err);
                io.mirror_out = nullptr; io.mrows = mirror_t_cb; io.mrows_user = &rec;
                CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "mrows with a page-locked"), "mrows, pinned: %s", err);
            } else {
                io.mrows = nullptr; io.mirror_out = host.data(); io.mirror_ld = nx;
                CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "without a page-locked"), "mirror_out, pageable: %s", err);
            }
            qk_cuda_host_free(pk);
            qk_cuda_host_free(pt);
        }
    {   /* a symmetric plan; a DEVICE output; the MPS path */
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = nx;
        g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32;
        std::vector<float> host((size_t)(nx * nx));
        g.output = QK_OUTPUT_HOST; g.out = host.data();
        qk_plan p;
        qk_cuda_io io;
        memset(&io, 0, sizeof io);
        io.mrows = mirror_t_cb;
        if (qk_plan_make(gpu, m, &g, &p) == QK_OK)
            CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "symmetric plan"), "K(X,X): %s", err);
        else CHECK(false, "mirror io: plan: %s", qk_last_error());
        void *dk = nullptr;
        g.y = y.data(); g.n_y = ny;
        g.output = QK_OUTPUT_DEVICE;
        if (cudaMalloc(&dk, (size_t)(nx * ny) * 4) == cudaSuccess) {
            g.out = dk;
            if (qk_plan_make(gpu, m, &g, &p) == QK_OK)
                CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "a DEVICE output"), "DEVICE: %s", err);
            else CHECK(false, "mirror io: plan: %s", qk_last_error());
            cudaFree(dk);
        } else CHECK(false, "mirror io: cudaMalloc");
        const double site[8] = {1, 0, 0, 0, 0, 0, 0, 0};
        qk_cuda_mps mps;
        memset(&mps, 0, sizeof mps);
        mps.n_sites = 1; mps.chi = 1; mps.a = site; mps.n_a = 1;
        CHECK(qk_cuda_mps_gram(&p, &g, &mps, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "qk_cuda_gram's only"), "MPS: %s", err);
    }
    qk_map_free(m);
}

/* ---- a band of K(X,X)'s rows in one call (qk_cuda_io.band_rows: a GPU's part on several GPUs):
   rows [0, h) whole against the CPU engine within the plan's stated bound, for every precision
   at 7 and 8 qubits (the fused, cuBLAS and tensor-core engines; on an sm_90a build the
   persistent wgmma kernels, whose mirror stops at the band's end inside a tile), as planned, in slabs of 16 (K not
   resident: whole rows), and with the states in tiles of 32 too (the band's end inside a tile),
   into a DEVICE buffer (rows past the band stay as they were) and through the rows callback
   (no row past the band delivered); then the refusals ---- */
struct BandRec {
    std::vector<double> *K;
    int64_t cols, max_row;
    size_t es;
};
static qk_result band_rows_cb(int64_t i0, int64_t m, const void *r, int64_t ld, void *u)
{
    BandRec *c = (BandRec *)u;
    rows_into(*c->K, c->cols, c->es, i0, m, r, ld);
    c->max_row = std::max(c->max_row, i0 + m - 1);
    return QK_OK;
}
static void band_io_tests(qk_ctx *gpu, int q, int64_t nfix = 0)
{
    qk_map *m = nullptr;
    if (qk_map_parse("zz(reps=2)", q, &m) != QK_OK) { CHECK(false, "band io: parse"); return; }
    const int64_t n = nfix > 0 ? nfix : 150 + (int64_t)(qk_test_rand64() % 60);
    std::vector<double> x((size_t)n * q);
    for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
    std::vector<double> ref((size_t)(n * n));   /* the CPU engine's K(X,X), fp64 */
    {
        qk_ctx *cpu = qk_test_cpu_ctx(0);
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n;
        g.precision = QK_PRECISION_FP64; g.out_dtype = QK_F64; g.out = ref.data();
        CHECK(qk_gram(cpu, m, &g) == QK_OK, "band io: cpu: %s", qk_last_error());
        qk_ctx_destroy(cpu);
    }
    char err[512];
    const qk_precision precs[4] = {QK_PRECISION_FP32, QK_PRECISION_FP64, QK_PRECISION_FP32X3, QK_PRECISION_FP16};
    for (qk_precision pr : precs)
        for (int variant = 0; variant < 3; ++variant)
            for (int dev = 0; dev < 2; ++dev) {
                const int64_t h = 1 + (int64_t)(qk_test_rand64() % (uint64_t)(n - 1));   /* 1 .. n-1 */
                const size_t es = pr == QK_PRECISION_FP64 ? 8 : 4;
                char what[160];
                qk_gram_desc g;
                memset(&g, 0, sizeof g);
                g.x = x.data(); g.n_x = n;
                g.precision = pr; g.out_dtype = es == 8 ? QK_F64 : QK_F32;
                std::vector<unsigned char> host((size_t)(n * n) * es);
                for (size_t i = 0; i < host.size() / es; ++i) {   /* NaN: what the job must not write stays NaN */
                    if (es == 8) ((double *)host.data())[i] = NAN; else ((float *)host.data())[i] = NAN;
                }
                void *dk = nullptr;
                if (dev) {
                    if (cudaMalloc(&dk, host.size()) != cudaSuccess) { CHECK(false, "band io: cudaMalloc"); continue; }
                    cudaMemcpy(dk, host.data(), host.size(), cudaMemcpyHostToDevice);
                    g.output = QK_OUTPUT_DEVICE; g.out = dk;
                } else { g.output = QK_OUTPUT_HOST; g.out = host.data(); }
                qk_plan p;
                if (qk_plan_make(gpu, m, &g, &p) != QK_OK) { CHECK(false, "band io: plan: %s", qk_last_error()); cudaFree(dk); continue; }
                if (variant >= 1) { p.tile_m = p.slab_rows = 16; p.k_resident = 0; }
                if (variant == 2) { p.bulk_states = 0; p.state_tile = 32; }
                snprintf(what, sizeof what, "band io %d q %s %s h=%lld of %lld (engine %d, %s)", q, qk_precision_name(pr), dev ? "device" : "host",
                         (long long)h, (long long)n, (int)p.engine, variant == 0 ? "as planned" : variant == 1 ? "slabs of 16" : "slabs of 16, state tiles of 32");
                std::vector<double> K((size_t)(n * n), NAN);
                BandRec rec{&K, n, -1, es};
                qk_cuda_io io;
                memset(&io, 0, sizeof io);
                io.rows = band_rows_cb; io.rows_user = &rec;
                io.band_rows = h;
                err[0] = 0;
                const qk_result r = qk_cuda_gram(&p, m, &g, &io, err, sizeof err);
                CHECK(r == QK_OK, "%s: %s", what, err);
                if (dev) {
                    cudaMemcpy(host.data(), dk, host.size(), cudaMemcpyDeviceToHost);
                    for (int64_t i = 0; i < n * n; ++i) K[(size_t)i] = es == 4 ? ((const float *)host.data())[i] : ((const double *)host.data())[i];
                    cudaFree(dk);
                } else CHECK(rec.max_row == h - 1, "%s: rows delivered up to %lld", what, (long long)rec.max_row);
                int64_t off = 0, past = 0;
                double worst = 0;
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        const double k = K[(size_t)(i * n + j)];
                        if (i >= h) { past += !std::isnan(k); continue; }
                        const double e = std::fabs(k - ref[(size_t)(i * n + j)]);
                        off += !(e <= p.error_bound);
                        if (!(e <= worst)) worst = e;
                    }
                CHECK(r != QK_OK || (off == 0 && past == 0), "%s: %lld entries of the band off (worst %.3g, bound %.3g), %lld written past it", what,
                      (long long)off, worst, p.error_bound, (long long)past);
            }
    if (q == 7) {   /* refusals: K(X,Y), a band past n_x or below 0, with the transposed output; the MPS path */
        qk_gram_desc g;
        memset(&g, 0, sizeof g);
        g.x = x.data(); g.n_x = n; g.y = x.data(); g.n_y = n;
        g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32;
        std::vector<float> host((size_t)(n * n));
        g.output = QK_OUTPUT_HOST; g.out = host.data();
        std::vector<double> K((size_t)(n * n));
        BandRec rec{&K, n, -1, 4};
        qk_plan p;
        qk_cuda_io io;
        memset(&io, 0, sizeof io);
        io.rows = band_rows_cb; io.rows_user = &rec;
        io.band_rows = 5;
        if (qk_plan_make(gpu, m, &g, &p) == QK_OK)
            CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "band_rows") && strstr(err, "K(X,Y)"),
                  "band of K(X,Y): %s", err);
        else CHECK(false, "band io: plan: %s", qk_last_error());
        g.y = nullptr; g.n_y = 0;
        if (qk_plan_make(gpu, m, &g, &p) == QK_OK) {
            io.band_rows = n + 1;
            CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "outside"), "band past n: %s", err);
            io.band_rows = -1;
            CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "outside"), "band below 0: %s", err);
            io.band_rows = 5; io.mrows = mirror_t_cb;
            CHECK(qk_cuda_gram(&p, m, &g, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "transposed output"), "band with mrows: %s", err);
            io.mrows = nullptr;
            const double site[8] = {1, 0, 0, 0, 0, 0, 0, 0};
            qk_cuda_mps mps;
            memset(&mps, 0, sizeof mps);
            mps.n_sites = 1; mps.chi = 1; mps.a = site; mps.n_a = 1;
            CHECK(qk_cuda_mps_gram(&p, &g, &mps, &io, err, sizeof err) == QK_ERROR_INVALID_ARGUMENT && strstr(err, "band_rows"), "MPS band: %s", err);
        } else CHECK(false, "band io: plan: %s", qk_last_error());
    }
    qk_map_free(m);
}

static void stream_tests(qk_ctx *gpu)
{
    const char *specs[] = {"zz(reps=2)", "hea(layers=2)", "angle(rot=y)"};
    const int d = 6;
    for (const char *spec : specs) {
        qk_map *m = nullptr;
        CHECK(qk_map_parse(spec, d, &m) == QK_OK, "stream %s: parse", spec);
        if (!m) continue;
        for (int sym = 1; sym >= 0; --sym) {
            const int64_t nx = 1000 + (int64_t)(qk_test_rand64() % 77), ny = sym ? nx : 457;
            std::vector<double> x((size_t)nx * d), y((size_t)ny * d);
            for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
            for (auto &v : y) v = qk_test_uniform(0, 2 * M_PI);
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = nx;
            if (!sym) { g.y = y.data(); g.n_y = ny; }
            g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32;
            qk_plan p;
            CHECK(qk_plan_make(gpu, m, &g, &p) == QK_OK, "stream %s: plan: %s", spec, qk_last_error());
            p.tile_m = p.slab_rows = 128; /* many slabs */
            p.k_resident = sym;          /* the symmetric mirror on the device */
            const size_t bytes = (size_t)nx * ny * 4;
            float *pin = nullptr;
            cudaMallocHost((void **)&pin, bytes);
            for (size_t i = 0; i < (size_t)nx * ny; ++i) pin[i] = NAN;
            g.out = pin; g.output = p.output = QK_OUTPUT_HOST; p.host_pinned = 1;
            qk_result r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_OK, "stream %s: pinned -> %d %s", spec, (int)r, qk_last_error());
            int64_t nan = 0;
            for (size_t i = 0; i < (size_t)nx * ny; ++i) nan += std::isnan(pin[i]);
            CHECK(nan == 0, "stream %s: pinned K has %lld unwritten entries", spec, (long long)nan);
            /* touched pageable */
            std::vector<float> pg((size_t)nx * ny, NAN);
            g.out = pg.data(); p.host_pinned = 0;
            r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_OK && memcmp(pg.data(), pin, bytes) == 0, "stream %s %s: pageable K differs from pinned K", spec, sym ? "XX" : "XY");
            /* fresh pageable */
            float *fr = (float *)malloc(bytes);
            g.out = fr;
            r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_OK && memcmp(fr, pin, bytes) == 0, "stream %s %s: fresh-buffer K differs from pinned K", spec, sym ? "XX" : "XY");
            free(fr);
            /* .npy stream */
            char path[256];
            snprintf(path, sizeof path, "/tmp/qk_gpu_stream_%d.npy", (int)getpid());
            g.out = nullptr; g.output = p.output = QK_OUTPUT_NPY; g.out_path = path;
            r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_OK, "stream %s: npy -> %d %s", spec, (int)r, qk_last_error());
            qk_array a;
            memset(&a, 0, sizeof a);
            if (r == QK_OK && qk_npy_read(path, &a) == QK_OK) {
                int64_t diff = 0;
                for (size_t i = 0; i < (size_t)nx * ny; ++i) diff += a.data[i] != (double)pin[i];
                CHECK(a.rows == nx && a.cols == ny && diff == 0, "stream %s %s: .npy K differs from pinned K in %lld entries", spec, sym ? "XX" : "XY", (long long)diff);
                qk_array_free(&a);
            } else CHECK(false, "stream %s: cannot read the streamed .npy: %s", spec, qk_last_error());
            /* cancelled stream: no temp file, the old file intact */
            int calls = 0;
            g.progress = cancel_after; g.progress_user = &calls;
            r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_ERROR_CANCELLED, "stream %s: cancel -> %d", spec, (int)r);
            char cmd[600];
            snprintf(cmd, sizeof cmd, "ls %s.tmp.* >/dev/null 2>&1", path);
            CHECK(system(cmd) != 0, "stream %s: a temporary file was left behind after a cancel", spec);
            memset(&a, 0, sizeof a);
            CHECK(qk_npy_read(path, &a) == QK_OK && a.rows == nx, "stream %s: the old output was damaged by a cancelled run", spec);
            qk_array_free(&a);
            remove(path);
            g.progress = nullptr;
            /* square tiles through the callback */
            TileRec tr;
            tr.K.assign((size_t)nx * ny, NAN); tr.ny = ny; tr.calls = tr.bad = tr.nonsq = 0; tr.sym = sym; tr.side = p.slab_rows;
            g.output = p.output = QK_OUTPUT_CALLBACK; g.out_path = nullptr; g.tile_fn = tile_rec; g.tile_user = &tr;
            r = qk__plan_run(gpu, &p, m, &g, NULL);
            CHECK(r == QK_OK && tr.bad == 0 && tr.nonsq == 0 && memcmp(tr.K.data(), pin, bytes) == 0,
                  "stream %s %s: callback tiles: rc %d, %d calls, %d below the diagonal, %d not square, K %s", spec, sym ? "XX" : "XY",
                  (int)r, tr.calls, tr.bad, tr.nonsq, memcmp(tr.K.data(), pin, bytes) ? "differs" : "equal");
            cudaFreeHost(pin);
        }
        printf("stream %-14s ok\n", spec);
        qk_map_free(m);
    }
}

/* ---- the stream pool: a context's streams and cuBLAS handle are made once per GPU ---- */
/* A fresh context's first Gram makes the pool (3 streams) and, on a cuBLAS engine, its handle,
   and the pool keeps the job's large device buffers; the next calls borrow them all: each
   acquires at least that many resources fewer than the first (the buffers too), the same number
   each time, on every output, and K is bit for bit the first call's (the planner counts the
   pool's buffers as free, so the plan does not change). The context holds device memory between
   calls; destroying it returns all of it. */
static void pool_tests()
{
    /* path: the plan's (the amplitude case runs the streaming encoder, the MPS case the MPS
       engine: both borrow the pool's streams and buffers too) */
    struct Case { const char *spec; int d; int64_t n; qk_precision p; qk_output out; int blas; qk_path path; };
    const Case cases[] = {{"zz(reps=2)", 9, 700, QK_PRECISION_FP32X3, QK_OUTPUT_HOST, 1, QK_PATH_DEFAULT}, /* cuBLAS + epilogue at 9 qubits */
                          {"zz(reps=2)", 9, 500, QK_PRECISION_FP64, QK_OUTPUT_DEVICE, -1, QK_PATH_DEFAULT},
                          {"hea(layers=2)", 6, 400, QK_PRECISION_FP32, QK_OUTPUT_CALLBACK, -1, QK_PATH_DEFAULT},
                          {"amplitude", 60, 600, QK_PRECISION_FP64, QK_OUTPUT_HOST, -1, QK_PATH_REAL},
                          {"zz(reps=1)", 12, 300, QK_PRECISION_FP64, QK_OUTPUT_HOST, -1, QK_PATH_MPS},
                          {"zz(reps=1)", 10, 256, QK_PRECISION_FP32, QK_OUTPUT_DEVICE, -1, QK_PATH_MPS}};
    for (const Case &c : cases) {
        qk_map *m = nullptr;
        if (qk_map_parse(c.spec, c.d, &m) != QK_OK) { CHECK(false, "pool: parse %s", c.spec); continue; }
        std::vector<double> x((size_t)c.n * c.d);
        for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
        const size_t cnt = (size_t)c.n * c.n;
        double *dbuf = nullptr;
        if (c.out == QK_OUTPUT_DEVICE) cudaMalloc((void **)&dbuf, cnt * 8);
        qk_ctx *gpu = nullptr;
        qk_ctx_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CUDA;
        cd.autotune = -1;
        if (qk_ctx_create(&cd, &gpu) != QK_OK) { CHECK(false, "pool: context: %s", qk_last_error()); qk_map_free(m); continue; }
        TileRec tr;
        qk_plan plan;
        auto run = [&](std::vector<double> &dst) -> qk_result {
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = c.n; g.precision = c.p; g.output = c.out;
            if (c.path == QK_PATH_MPS) g.path = QK_PATH_MPS;
            g.out_dtype = c.out == QK_OUTPUT_CALLBACK ? QK_F32 : QK_F64; /* tile_rec records float tiles */
            dst.assign(cnt, NAN);
            if (c.out == QK_OUTPUT_HOST) g.out = dst.data();
            if (c.out == QK_OUTPUT_DEVICE) { cudaMemset(dbuf, 0xff, cnt * 8); g.out = dbuf; }
            if (c.out == QK_OUTPUT_CALLBACK) {
                tr.K.assign(cnt, NAN); tr.ny = c.n; tr.calls = tr.bad = tr.nonsq = 0; tr.sym = true; tr.side = 1 << 30;
                g.tile_fn = tile_rec; g.tile_user = &tr;
            }
            qk_result r = qk_plan_make(gpu, m, &g, &plan);
            if (r == QK_OK) r = qk_gram(gpu, m, &g);
            if (r == QK_OK && c.out == QK_OUTPUT_DEVICE) cudaMemcpy(dst.data(), dbuf, cnt * 8, cudaMemcpyDeviceToHost);
            if (r == QK_OK && c.out == QK_OUTPUT_CALLBACK) dst.assign(tr.K.begin(), tr.K.end());
            return r;
        };
        std::vector<double> k1, k2, k3;
        const int c0 = qk_cuda_test_alloc_count();
        qk_result r1 = run(k1);
        const int c1 = qk_cuda_test_alloc_count();
        qk_result r2 = run(k2);
        const int c2 = qk_cuda_test_alloc_count();
        qk_result r3 = run(k3);
        const int c3 = qk_cuda_test_alloc_count();
        const int blas = plan.engine >= QK_GPU_CUBLAS && plan.engine <= QK_GPU_TC_FP64; /* engines on a cuBLAS handle */
        CHECK(r1 == QK_OK && r2 == QK_OK && r3 == QK_OK, "pool %s: %s", c.spec, qk_last_error());
        CHECK(c.blas < 0 || blas == c.blas, "pool %s: the plan's engine (%s) is not the case's (blas %d)", c.spec, plan.config, c.blas);
        CHECK(c.path == QK_PATH_DEFAULT || (plan.path == c.path && (c.path != QK_PATH_REAL || qk__plan_stream_amp(&plan, m))),
              "pool %s: the plan's path %d is not the case's %d (or not the streaming encoder)", c.spec, (int)plan.path, (int)c.path);
        /* the pool's 3 streams, its cuBLAS handle, and on a staged output the context's two pinned
           staging buffers (kept across calls since before the pool) */
        const int want = 3 + (blas ? 1 : 0) + (c.out != QK_OUTPUT_DEVICE ? 2 : 0);
        printf("pool %-14s out=%d %s: acquisitions %d, then %d, %d (want more than %d fewer)\n", c.spec, (int)c.out, plan.config, c1 - c0,
               c2 - c1, c3 - c2, want);
        CHECK((c1 - c0) - (c2 - c1) > want && c3 - c2 == c2 - c1, "pool %s out=%d: acquisitions %d, %d, %d: the second and third "
              "calls should acquire more than %d fewer (the pool's streams%s%s, and its buffers)", c.spec, (int)c.out, c1 - c0, c2 - c1,
              c3 - c2, want, blas ? ", its cuBLAS handle" : "", c.out != QK_OUTPUT_DEVICE ? ", the staging" : "");
        CHECK(k1.size() == cnt && memcmp(k1.data(), k2.data(), cnt * 8) == 0 && memcmp(k1.data(), k3.data(), cnt * 8) == 0,
              "pool %s: K differs between calls that borrow the pool", c.spec);
        bool finite = true;
        for (double v : k1) finite = finite && std::isfinite(v);
        CHECK(finite, "pool %s: K not finite", c.spec);
        cudaDeviceSynchronize();
        size_t f0 = 0, f1 = 0, tot = 0;
        cudaMemGetInfo(&f0, &tot);
        qk_ctx_destroy(gpu);
        cudaMemGetInfo(&f1, &tot);
        CHECK(f1 >= f0 && cudaGetLastError() == cudaSuccess, "pool %s: destroying the context lost device memory or failed", c.spec);
        if (dbuf) cudaFree(dbuf);
        qk_map_free(m);
    }
}

/* ---- fault injection: every resource acquisition of a job fails in turn ---- */
/* For each k, the k-th cudaMalloc / cudaMallocHost / stream / event / cuBLAS handle of the job
   fails as if out of memory: qk_gram either succeeds (the engine retried with smaller slabs) with
   the right K, or returns a clean error with the caller's output untouched (a poisoned buffer
   still poisoned, no .npy, no temporary file); device memory returns to its level before once
   the context is destroyed (a context keeps its stream pool, cuBLAS handle and buffers included,
   across calls: each run here has a fresh one). */
static void fault_tests()
{
    struct Case { const char *spec; int d; int64_t n; qk_output out; };
    const Case cases[] = {{"zz(reps=2)", 8, 300, QK_OUTPUT_HOST}, {"zz(reps=2)", 8, 300, QK_OUTPUT_NPY},
                          {"zz(reps=2)", 4, 300, QK_OUTPUT_DEVICE}, {"angle(rot=y)", 5, 200, QK_OUTPUT_CALLBACK}};
    size_t free0 = 0, free1 = 0, total = 0;
    cudaDeviceSynchronize();
    cudaMemGetInfo(&free0, &total);
    const size_t live0 = qk_cuda_test_live_bytes();
    for (const Case &c : cases) {
        qk_map *m = nullptr;
        if (qk_map_parse(c.spec, c.d, &m) != QK_OK) { CHECK(false, "fault: parse %s", c.spec); continue; }
        std::vector<double> x((size_t)c.n * c.d);
        for (auto &v : x) v = qk_test_uniform(0, 2 * M_PI);
        const size_t cnt = (size_t)c.n * c.n;
        std::vector<float> ref(cnt, NAN), got(cnt);
        float *dbuf = nullptr;
        if (c.out == QK_OUTPUT_DEVICE) cudaMalloc((void **)&dbuf, cnt * 4);
        char path[128];
        snprintf(path, sizeof path, "/tmp/qk_fault_%d.npy", (int)getpid());
        TileRec tr;
        auto run = [&](std::vector<float> &dst) -> qk_result {
            qk_gram_desc g;
            memset(&g, 0, sizeof g);
            g.x = x.data(); g.n_x = c.n; g.precision = QK_PRECISION_FP32; g.out_dtype = QK_F32; g.output = c.out;
            if (c.out == QK_OUTPUT_HOST) g.out = dst.data();
            if (c.out == QK_OUTPUT_DEVICE) { cudaMemset(dbuf, 0xff, cnt * 4); g.out = dbuf; }
            if (c.out == QK_OUTPUT_NPY) g.out_path = path;
            if (c.out == QK_OUTPUT_CALLBACK) {
                tr.K.assign(cnt, NAN); tr.ny = c.n; tr.calls = tr.bad = tr.nonsq = 0; tr.sym = true; tr.side = 1 << 30;
                g.tile_fn = tile_rec; g.tile_user = &tr;
            }
            /* a fresh context each run: its stream pool and the pool's buffers are acquired in the
               run too, so each of them fails in turn */
            qk_ctx *gpu = nullptr;
            qk_ctx_desc cd;
            memset(&cd, 0, sizeof cd);
            cd.device = QK_DEVICE_CUDA;
            cd.autotune = -1;
            qk_result r = qk_ctx_create(&cd, &gpu);
            if (r == QK_OK) r = qk_gram(gpu, m, &g);
            qk_ctx_destroy(gpu);
            if (r == QK_OK && c.out == QK_OUTPUT_DEVICE) cudaMemcpy(dst.data(), dbuf, cnt * 4, cudaMemcpyDeviceToHost);
            if (r == QK_OK && c.out == QK_OUTPUT_CALLBACK) dst = tr.K;
            if (r == QK_OK && c.out == QK_OUTPUT_NPY) {
                qk_array a;
                memset(&a, 0, sizeof a);
                if (qk_npy_read(path, &a) == QK_OK && (size_t)(a.rows * a.cols) == cnt)
                    for (size_t i = 0; i < cnt; ++i) dst[i] = (float)a.data[i];
                qk_array_free(&a);
            }
            return r;
        };
        CHECK(run(ref) == QK_OK, "fault %s out=%d: reference run: %s", c.spec, (int)c.out, qk_last_error()); /* warms the context */
        const int c0 = qk_cuda_test_alloc_count();
        CHECK(run(ref) == QK_OK, "fault %s out=%d: counting run", c.spec, (int)c.out);
        const int n_alloc = qk_cuda_test_alloc_count() - c0;
        int ok = 0, failed = 0;
        /* k > 0: the k-th acquisition fails once (the engine retries); k < 0: it and every later
           one fail (the retries fail too: a clean error) */
        for (int kk = 1; kk <= 2 * n_alloc; ++kk) {
            const int k = kk <= n_alloc ? kk : -(kk - n_alloc);
            if (c.out == QK_OUTPUT_NPY) { FILE *f = fopen(path, "wb"); if (f) { fputs("old", f); fclose(f); } }
            std::fill(got.begin(), got.end(), NAN);
            qk_cuda_test_fail_alloc(k);
            qk_result r = run(got);
            qk_cuda_test_fail_alloc(0);
            if (r == QK_OK) {
                ok++;
                double maxerr = 0;
                for (size_t i = 0; i < cnt; ++i) maxerr = std::max(maxerr, std::isnan(got[i]) ? INFINITY : fabs((double)got[i] - ref[i]));
                CHECK(maxerr <= 1e-5, "fault %s out=%d k=%d: succeeded after a retry but K is off by %.3g", c.spec, (int)c.out, k, maxerr);
            } else {
                failed++;
                CHECK(r == QK_ERROR_DEVICE_OUT_OF_MEMORY || r == QK_ERROR_CUDA, "fault %s out=%d k=%d: result %d (%s)", c.spec, (int)c.out, k,
                      (int)r, qk_last_error());
                int64_t touched = 0;
                if (c.out == QK_OUTPUT_HOST) for (size_t i = 0; i < cnt; ++i) touched += !std::isnan(got[i]);
                CHECK(touched == 0, "fault %s out=%d k=%d: a failed call wrote %lld entries of the caller's K", c.spec, (int)c.out, k, (long long)touched);
                if (c.out == QK_OUTPUT_NPY) {
                    char buf[8] = "";
                    FILE *f = fopen(path, "rb");
                    size_t nr = f ? fread(buf, 1, 7, f) : 0;
                    if (f) fclose(f);
                    buf[nr] = 0;
                    CHECK(strcmp(buf, "old") == 0, "fault npy k=%d: the previous file was touched", k);
                }
            }
            if (c.out == QK_OUTPUT_NPY) {
                char cmd[300];
                snprintf(cmd, sizeof cmd, "ls %s.tmp.* >/dev/null 2>&1", path);
                CHECK(system(cmd) != 0, "fault npy k=%d: a temporary file was left behind", k);
            }
        }
        printf("fault %-14s out=%d: %d acquisitions, each failed in turn, once and for good: %d succeeded, %d clean errors\n",
               c.spec, (int)c.out, n_alloc, ok, failed);
        CHECK(n_alloc >= 5 && failed >= n_alloc / 2, "fault %s: %d acquisitions counted, %d clean errors", c.spec, n_alloc, failed);
        remove(path);
        if (dbuf) cudaFree(dbuf);
        qk_map_free(m);
    }
    cudaDeviceSynchronize();
    cudaMemGetInfo(&free1, &total);
    /* (under compute-sanitizer its own shadow allocations move the free figure; its leak check
       is the test there: bench/run.sh sanitizers sets QK_TEST_UNDER_SANITIZER) */
    if (!getenv("QK_TEST_UNDER_SANITIZER"))
        CHECK(free1 + ((size_t)8 << 20) >= free0, "fault: device memory not returned: %.1f MB less free after the fault runs",
              ((double)free0 - (double)free1) / 1048576.0);
    /* the engine's own count (other processes on the GPU do not move it): every byte back */
    CHECK(qk_cuda_test_live_bytes() == live0, "fault: the engine holds %zu bytes of device memory after the fault runs, %zu before",
          qk_cuda_test_live_bytes(), live0);
}

/* a comma-separated list of qubit counts (argv[3]) */
static std::vector<int> qubit_list(const char *s)
{
    std::vector<int> qs;
    for (const char *p = s; *p;) { qs.push_back(atoi(p)); while (*p && *p != ',') ++p; if (*p) ++p; }
    return qs;
}

int main(int argc, char **argv)
{
    if (qk_cuda_device_count() <= 0) { printf("no CUDA device: skipped\n"); return 77; }
    setvbuf(stdout, nullptr, _IOLBF, 0);   /* line by line: a run killed by a timeout keeps how far it got */
    qk_test_seed();
    /* QK_TEST_POISON: every cuBLAS-path C poisoned with NaN before its GEMMs (the initcheck run) */
    qk_cuda_test_poison_gemm(getenv("QK_TEST_POISON") != NULL);
    int qmax = argc > 1 ? atoi(argv[1]) : 20;
    /* QK_TEST_ONLY=maps: the map families at the qubit counts asked, no other part */
    const bool maps_only = getenv("QK_TEST_ONLY") && !strcmp(getenv("QK_TEST_ONLY"), "maps");
    if (getenv("QK_TEST_ONLY") && !maps_only) { /* one part (sanitizer runs, mutation checks): small, tcblocks, plan, mirror */
        if (!strcmp(getenv("QK_TEST_ONLY"), "small")) small_kernel_tests();
        else if (!strcmp(getenv("QK_TEST_ONLY"), "tcblocks")) tc_block_tests();
        else if (!strcmp(getenv("QK_TEST_ONLY"), "plan")) plan_mismatch_tests();
        else if (!strcmp(getenv("QK_TEST_ONLY"), "planes")) {
            planes_tests(argc > 3 ? qubit_list(argv[3]) : std::vector<int>());
        }
        else if (!strcmp(getenv("QK_TEST_ONLY"), "mirror")) {   /* the transposed output and the band alone */
            qk_ctx *gpu = nullptr;
            qk_ctx_desc cd;
            memset(&cd, 0, sizeof cd);
            cd.device = QK_DEVICE_CUDA;
            cd.autotune = -1;
            if (qk_ctx_create(&cd, &gpu) == QK_OK) {
                mirror_io_tests(gpu);
                band_io_tests(gpu, 7);
                band_io_tests(gpu, 8);
                /* 4 and 5 qubits: the TMA fp32x3 kernel at one stage (fp32x3 asked; the default
                   from 5 qubits), a band's mirror stopping at its end */
                band_io_tests(gpu, 4, 196);
                band_io_tests(gpu, 5, 201);
            }
            else CHECK(false, "cuda context: %s", qk_last_error());
            qk_ctx_destroy(gpu);
        }
        else CHECK(false, "QK_TEST_ONLY=%s: small, tcblocks, planes, plan, mirror (and band) or maps", getenv("QK_TEST_ONLY"));
        printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
        return qk_test_fails ? 1 : 0;
    }
    /* each part's wall time, printed as it ends: what a short device run spends before the maps */
    double t_part = qk_cuda_wtime();
    auto part_done = [&t_part](const char *name) {
        const double t = qk_cuda_wtime();
        printf("part %-10s %7.2f s\n", name, t - t_part);
        t_part = t;
    };
    if (!maps_only) {
        amp_encode_tests();
        part_done("amp");
        if (argc <= 2 || atoi(argv[2]) != 0) { api_tests(); part_done("api"); } /* argv[2] = 0: skip (racecheck runs) */
        {
            qk_ctx *gpu = nullptr;
            qk_ctx_desc cd;
            memset(&cd, 0, sizeof cd);
            cd.device = QK_DEVICE_CUDA;
            cd.autotune = -1;
            pool_tests();
            part_done("pool");
            if (qk_ctx_create(&cd, &gpu) == QK_OK) {
                stream_tests(gpu);
                part_done("stream");
                mirror_io_tests(gpu);
                part_done("mirror");
                band_io_tests(gpu, 7);
                band_io_tests(gpu, 8);
                band_io_tests(gpu, 4, 196);
                band_io_tests(gpu, 5, 201);
                part_done("band");
                fault_tests();
                part_done("fault");
                fp32_same_tests(gpu);
                part_done("fp32same");
            }
            else CHECK(false, "cuda context: %s", qk_last_error());
            qk_ctx_destroy(gpu);
        }
        tc_block_tests();
        part_done("tcblocks");
        planes_tests();
        part_done("planes");
        small_kernel_tests();
        part_done("small");
        plan_mismatch_tests();
        part_done("plan");
    }
    /* argv[3]: a comma-separated list of qubit counts to run instead of 1..qmax (the sanitizer
       runs: e.g. "3,8,14" = one fused, one cuBLAS, one multi-pass state case) */
    std::vector<int> qs;
    if (argc > 3) qs = qubit_list(argv[3]);
    else for (int q = 1; q <= qmax; ++q) qs.push_back(q);
    for (int q : qs) {
        bool thorough = q <= 9 || q == 13 || q == 14;
        std::vector<TMap> maps;
        maps.push_back(map_zz(q, 2, q <= 14));
        maps.push_back(map_iqp(q));
        maps.push_back(map_angle(q, "xyz"[q % 3]));
        if (q <= 16) maps.push_back(map_amp(q));
        maps.push_back(map_basis(q));
        maps.push_back(map_hea(q, 2, 'y', false));
        maps.push_back(map_hea(q, 2, 'z', q % 2 == 1));
        if (q >= 2) maps.push_back(map_mix(q));
        for (auto &t : maps) {
            t.finish();
            int before = qk_test_fails;
            run_map(t, thorough);
            printf("%-12s q=%2d %s\n", t.name.c_str(), q, qk_test_fails == before ? "ok" : "FAILED");
            fflush(stdout);
        }
        print_errq(q);
    }
    print_errtab();
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
