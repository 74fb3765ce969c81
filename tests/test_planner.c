/* Planner and VRAM estimator with injected devices (no GPU needed): a 24 GB, an 80 GB and a
   141 GB card. Checks the invariants the CUDA engine relies on: the plan's bytes stay within
   vram_fraction * free, bulk states exactly when they fit, state tiles are powers of two that
   fit, K resident on the device only when it fits, the engine and path by map class and
   qubits, qk_max_samples consistent with the bulk decision, errors for impossible requests. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <string.h>

static int fails = 0, checks = 0;
#define CHECK(c, ...) do { ++checks; if (!(c)) { ++fails; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static qk_device_info card(const char *name, double gb)
{
    qk_device_info d;
    memset(&d, 0, sizeof d);
    d.present = 1;
    snprintf(d.name, sizeof d.name, "%s", name);
    d.cc_major = 9;
    d.sm_count = 132;
    d.total_bytes = (size_t)(gb * 1e9);
    d.free_bytes = (size_t)(gb * 0.97e9);
    d.smem_per_block_optin = 227 * 1024;
    d.l2_bytes = 50u << 20;
    return d;
}

static qk_gram_desc gdesc(int64_t nx, int64_t ny, qk_output out)
{
    static double dummy = 0;
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = &dummy; g.n_x = nx;
    if (ny > 0) { g.y = &dummy; g.n_y = ny; }
    g.out = &dummy; g.output = out;
    return g;
}

static void invariants(const qk_plan *p, const qk_device_info *d, double frac, const char *what)
{
    double budget = frac * (double)d->free_bytes;
    CHECK(p->backend == QK_BACKEND_CUDA, "%s: backend %d", what, (int)p->backend);
    CHECK((double)p->bytes_total <= budget * 1.0000001, "%s: %.3g GB planned > budget %.3g GB", what, p->bytes_total * 1e-9, budget * 1e-9);
    CHECK(p->bytes_total == p->bytes_states + p->bytes_out + p->bytes_workspace, "%s: bytes do not add up", what);
    CHECK(p->tile_m >= 1 && p->tile_m <= p->n_x, "%s: slab rows %lld of %lld", what, (long long)p->tile_m, (long long)p->n_x);
    if (!p->bulk_states) {
        CHECK(p->state_tile > 0 && (p->state_tile & (p->state_tile - 1)) == 0, "%s: state tile %lld not a power of two", what, (long long)p->state_tile);
        CHECK(p->tile_m <= p->state_tile, "%s: slab %lld > state tile %lld", what, (long long)p->tile_m, (long long)p->state_tile);
    }
    CHECK(p->n_streams >= 2, "%s: streams %d", what, p->n_streams);
    CHECK(strcmp(p->device_name, d->name) == 0, "%s: device name '%s'", what, p->device_name);
}

/* Precision modes (docs/precision.md): which engine each mode gets, the operand bytes counted,
   the fallbacks, FP32 and FP64 plans as before, the autotune's admissible engines, the CPU
   engine's acceptance of every mode. */
static void precision_modes(const qk_device_info *cards, const qk_map *zz8, const qk_map *zz4, const qk_map *zz16,
                            const qk_map *hea, const qk_map *angle)
{
    static const qk_precision tc[3] = {QK_PRECISION_TF32, QK_PRECISION_FP32X3, QK_PRECISION_FP16};
    static const int mode[3] = {3, 4, 5};
    static const double vbytes[3] = {4.0, 8.0, 2.0}; /* operand bytes per real value (FP32X3: 4 fp16 blocks) */
    char buf[1024];
    int c, i, q, b;
    for (c = 0; c < 3; ++c) {
        const qk_device_info *d = &cards[c];
        qk_plan p, p32;
        qk_gram_desc g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32;
        CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p32) == QK_OK && p32.use_blas == 1, "%s zz8 fp32: blas %d", d->name, p32.use_blas);
        for (i = 0; i < 3; ++i) {
            const double W = 2.0 * 256; /* real values per complex 8-qubit state */
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK, "%s zz8 %s: %s", d->name, qk__prec_name(tc[i]), qk_last_error());
            invariants(&p, d, 0.85, "zz8 tensor cores");
            CHECK(p.use_blas == mode[i] && p.precision == tc[i] && p.out_dtype == QK_F32, "%s zz8 %s: blas %d precision %d dtype %d",
                  d->name, qk__prec_name(tc[i]), p.use_blas, (int)p.precision, (int)p.out_dtype);
            /* the workspace holds the complex slab (as fp32's) plus the operands: at least the
               columns and the rotated columns */
            CHECK((double)p.bytes_workspace >= (double)p.tile_m * 32768.0 * 8.0 + 2.0 * 32768.0 * W * vbytes[i],
                  "%s zz8 %s: workspace %zu too small for the operands", d->name, qk__prec_name(tc[i]), p.bytes_workspace);
            CHECK(p.bytes_workspace > p32.bytes_workspace, "%s zz8 %s: operands not counted", d->name, qk__prec_name(tc[i]));
            CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, qk__prec_name(tc[i])) && strstr(buf, "tensor cores"),
                  "%s zz8 %s: describe: %s", d->name, qk__prec_name(tc[i]), buf);
            /* K to the host: a ring of two slots, both counted */
            g = gdesc(32768, 0, QK_OUTPUT_HOST);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK && p.use_blas == mode[i], "%s zz8 host %s", d->name, qk__prec_name(tc[i]));
            invariants(&p, d, 0.85, "zz8 host tensor cores");
            CHECK(p.tile_m < 32768 && (double)p.bytes_workspace >= 2.0 * qk__blas_ws(mode[i], 1, 8, 4.0, (double)p.tile_m, 32768.0),
                  "%s zz8 host %s: ring workspace %zu", d->name, qk__prec_name(tc[i]), p.bytes_workspace);
            /* few qubits: the fp32 fused kernel, said so */
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz4, &g, &p) == QK_OK && p.use_blas == 0 && strstr(p.config, "do not pay"),
                  "%s zz4 %s: blas %d config '%s'", d->name, qk__prec_name(tc[i]), p.use_blas, p.config);
            /* 6 qubits: TF32 and FP16 on the tensor cores, FP32X3 (chunked) not yet */
            {
                qk_map *z6 = NULL;
                g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
                g.precision = tc[i];
                CHECK(qk_map_parse("zz(reps=2)", 6, &z6) == QK_OK && qk_plan_for_device(d, 0.85, z6, &g, &p) == QK_OK &&
                      p.use_blas == (tc[i] == QK_PRECISION_FP32X3 ? 0 : mode[i]), "%s zz6 %s: blas %d '%s'", d->name,
                      qk__prec_name(tc[i]), p.use_blas, p.config);
                qk_map_free(z6);
            }
            /* real path, product path */
            g = gdesc(16384, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, hea, &g, &p) == QK_OK && p.path == QK_PATH_REAL && p.use_blas == mode[i], "%s hea %s: blas %d",
                  d->name, qk__prec_name(tc[i]), p.use_blas);
            CHECK(qk_plan_for_device(d, 0.85, angle, &g, &p) == QK_OK && p.path == QK_PATH_ANALYTIC && p.use_blas == 0, "%s angle %s",
                  d->name, qk__prec_name(tc[i]));
        }
        /* FP32 and FP64 keep their engines at every qubit count (FP32 results unchanged) */
        for (q = 2; q <= 20; q += 3) {
            qk_map *m = NULL;
            if (qk_map_parse("zz(reps=2)", q, &m) != QK_OK) { CHECK(0, "parse zz %d", q); continue; }
            g = gdesc(q <= 12 ? 4096 : 256, 0, QK_OUTPUT_DEVICE);
            g.precision = QK_PRECISION_FP32;
            CHECK(qk_plan_for_device(d, 0.85, m, &g, &p) == QK_OK && p.use_blas == (q >= 7) && p.precision == QK_PRECISION_FP32,
                  "%s zz%d fp32: blas %d", d->name, q, p.use_blas);
            g.precision = QK_PRECISION_FP64;
            CHECK(qk_plan_for_device(d, 0.85, m, &g, &p) == QK_OK && p.use_blas == (q >= 7) && p.out_dtype == QK_F64,
                  "%s zz%d fp64: blas %d", d->name, q, p.use_blas);
            qk_map_free(m);
        }
    }
    {   /* FP32X3 operands (8x the states) that do not fit a 24 GB card: the fp32 cuBLAS engine */
        qk_plan p;
        qk_gram_desc g;
        int64_t n = qk_max_samples(&cards[0], 0.85, 16, QK_PRECISION_FP32) * 9 / 10;
        g = gdesc(n, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32X3;
        CHECK(qk_plan_for_device(&cards[0], 0.85, zz16, &g, &p) == QK_OK && p.use_blas == 1 && strstr(p.config, "exceed"),
              "24 GB zz16 n=%lld fp32x3: blas %d config '%s' (%s)", (long long)n, p.use_blas, p.config, qk_last_error());
        invariants(&p, &cards[0], 0.85, "zz16 fp32x3 fallback");
        /* n = 4096 on the 141 GB card fits (26 GB of operands) */
        g = gdesc(4096, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32X3;
        CHECK(qk_plan_for_device(&cards[2], 0.85, zz16, &g, &p) == QK_OK && p.use_blas == 4 && p.tile_m == 4096,
              "141 GB zz16 n=4096 fp32x3: blas %d slab %lld", p.use_blas, (long long)p.tile_m);
        invariants(&p, &cards[2], 0.85, "zz16 fp32x3 141 GB");
    }
    {   /* more than 24 qubits: no tensor-core engine */
        qk_map *z25 = NULL;
        qk_plan p;
        qk_gram_desc g = gdesc(8, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_TF32;
        g.path = QK_PATH_COMPLEX;   /* the statevector (the planner would take MPS for this local map) */
        CHECK(qk_map_parse("zz(reps=1,ent=linear)", 25, &z25) == QK_OK, "parse zz25");
        CHECK(z25 && qk_plan_for_device(&cards[2], 0.85, z25, &g, &p) == QK_OK && p.use_blas == 1 && strstr(p.config, "24 qubits"),
              "zz25 tf32: blas %d '%s'", p.use_blas, p.config);
        qk_map_free(z25);
    }
    /* engines the autotune may apply per precision: never a less accurate one */
    for (b = 0; b <= 7; ++b) {
        CHECK(qk__blas_ok(QK_PRECISION_FP32, QK_PATH_COMPLEX, b) == (b <= 2), "fp32 complex engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP32, QK_PATH_REAL, b) == (b <= 1), "fp32 real engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP64, QK_PATH_COMPLEX, b) == (b <= 1 || b == 7), "fp64 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_TF32, QK_PATH_COMPLEX, b) == (b <= 3), "tf32 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP32X3, QK_PATH_COMPLEX, b) == (b <= 2 || b == 4), "fp32x3 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP16, QK_PATH_REAL, b) == (b <= 1 || b == 5), "fp16 real engine %d", b);
    }
    {   /* the CPU engine takes every mode and computes in fp64: float32 output equal to fp32's */
        qk_ctx *cpu = NULL;
        qk_ctx_desc cd;
        qk_plan p;
        double x[37 * 4];
        float k32[37 * 37], kt[37 * 37];
        qk_gram_desc g;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU;
        cd.n_threads = 1;
        CHECK(qk_ctx_create(&cd, &cpu) == QK_OK, "cpu ctx: %s", qk_last_error());
        for (i = 0; i < 37 * 4; ++i) x[i] = 0.1 + 0.37 * (double)((i * 7919) % 101) / 101.0 * 6.0;
        memset(&g, 0, sizeof g);
        g.x = x; g.n_x = 37; g.out = k32; g.precision = QK_PRECISION_FP32;
        CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_OK, "cpu fp32: %s", qk_last_error());
        for (i = QK_PRECISION_TF32; i < QK_PRECISION_COUNT; ++i) {
            memset(kt, 0xff, sizeof kt);
            g.out = kt; g.precision = (qk_precision)i;
            CHECK(cpu && qk_plan_make(cpu, zz4, &g, &p) == QK_OK && p.backend == QK_BACKEND_CPU && p.precision == QK_PRECISION_FP64 &&
                  p.out_dtype == QK_F32 && strstr(p.config, "fp64") && strstr(p.config, qk__prec_name((qk_precision)i)),
                  "cpu plan %s: '%s'", qk__prec_name((qk_precision)i), p.config);
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_OK && memcmp(kt, k32, sizeof kt) == 0, "cpu %s: K differs from fp32's", qk__prec_name((qk_precision)i));
        }
        g.precision = (qk_precision)QK_PRECISION_COUNT;
        CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_ERROR_INVALID_ARGUMENT, "unknown precision must fail");
        qk_ctx_destroy(cpu);
    }
}

int main(void)
{
    qk_device_info cards[3];
    qk_map *zz8 = NULL, *zz4 = NULL, *zz20 = NULL, *angle = NULL, *hea = NULL, *zz31 = NULL, *zz16 = NULL;
    int64_t prev = 0;
    int c;
    cards[0] = card("24 GB card", 24);
    cards[1] = card("H100 80GB", 80);
    cards[2] = card("H200", 141);
    CHECK(qk_map_parse("zz(reps=2)", 8, &zz8) == QK_OK, "parse zz8: %s", qk_last_error());
    CHECK(qk_map_parse("zz(reps=2)", 4, &zz4) == QK_OK, "parse zz4");
    CHECK(qk_map_parse("zz(reps=2,ent=linear)", 20, &zz20) == QK_OK, "parse zz20");
    CHECK(qk_map_parse("zz(reps=2)", 16, &zz16) == QK_OK, "parse zz16");
    CHECK(qk_map_parse("angle(rot=y)", 40, &angle) == QK_OK, "parse angle");
    CHECK(qk_map_parse("hea(layers=2,rot=y)", 12, &hea) == QK_OK, "parse hea");
    qk_map_parse("zz(reps=1,ent=linear)", 31, &zz31); /* local: made (MPS path) */
    if (fails) return 1;

    {   /* no device: the CPU plan */
        qk_device_info none;
        qk_plan p;
        qk_gram_desc g = gdesc(100, 0, QK_OUTPUT_HOST);
        memset(&none, 0, sizeof none);
        CHECK(qk_plan_for_device(&none, 0.85, zz8, &g, &p) == QK_OK && p.backend == QK_BACKEND_CPU, "no device -> CPU plan");
    }
    for (c = 0; c < 3; ++c) {
        const qk_device_info *d = &cards[c];
        qk_plan p;
        qk_gram_desc g;
        char buf[1024];
        int64_t ms, ms16;
        /* zz 8 qubits, n = 32768, K to the host: all states and K fit every card */
        g = gdesc(32768, 0, QK_OUTPUT_HOST);
        CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK, "%s zz8: %s", d->name, qk_last_error());
        invariants(&p, d, 0.85, "zz8 host");
        CHECK(p.bulk_states && p.k_resident && p.use_blas && p.path == QK_PATH_COMPLEX && p.symmetric, "%s zz8: bulk %d resident %d blas %d path %d",
              d->name, p.bulk_states, p.k_resident, p.use_blas, (int)p.path);
        CHECK(p.precision == QK_PRECISION_FP32 && p.out_dtype == QK_F32, "%s zz8: default precision/dtype", d->name);
        CHECK(p.bytes_staging > 0 && p.tile_m < 32768, "%s zz8 host: staging %zu slab %lld (pipelined)", d->name, p.bytes_staging, (long long)p.tile_m);
        CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, d->name), "%s: describe", d->name);
        /* zz 4 qubits on the device: the fused kernel, one slab */
        g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
        CHECK(qk_plan_for_device(d, 0.85, zz4, &g, &p) == QK_OK, "%s zz4: %s", d->name, qk_last_error());
        invariants(&p, d, 0.85, "zz4 device");
        CHECK(!p.use_blas && p.tile_m == 32768 && p.bytes_out == 0, "%s zz4: blas %d slab %lld out %zu", d->name, p.use_blas, (long long)p.tile_m, p.bytes_out);
        /* classes */
        g = gdesc(5000, 3000, QK_OUTPUT_HOST);
        CHECK(qk_plan_for_device(d, 0.85, angle, &g, &p) == QK_OK && p.path == QK_PATH_ANALYTIC && !p.symmetric, "%s angle: analytic", d->name);
        CHECK(qk_plan_for_device(d, 0.85, hea, &g, &p) == QK_OK && p.path == QK_PATH_REAL, "%s hea: real path", d->name);
        /* 20 qubits, n = 200000: states (1.6 TB) in tiles, K (160 GB) not resident */
        g = gdesc(200000, 0, QK_OUTPUT_CALLBACK);
        g.path = QK_PATH_COMPLEX;   /* the statevector's tiles (MPS would be the planner's choice) */
        CHECK(qk_plan_for_device(d, 0.85, zz20, &g, &p) == QK_OK, "%s zz20: %s", d->name, qk_last_error());
        invariants(&p, d, 0.85, "zz20 callback");
        CHECK(!p.bulk_states && !p.k_resident, "%s zz20: bulk %d resident %d", d->name, p.bulk_states, p.k_resident);
        CHECK((double)p.state_tile * 2 * 8.0 * (1 << 20) <= 0.5 * 0.85 * d->free_bytes, "%s zz20: tile %lld too big", d->name, (long long)p.state_tile);
        /* a smaller fraction never plans more */
        g = gdesc(200000, 0, QK_OUTPUT_CALLBACK);
        g.path = QK_PATH_COMPLEX;
        CHECK(qk_plan_for_device(d, 0.3, zz20, &g, &p) == QK_OK, "%s zz20 0.3: %s", d->name, qk_last_error());
        invariants(&p, d, 0.3, "zz20 fraction 0.3");
        /* qk_max_samples agrees with the bulk decision (zz reps=2 is the map it assumes) */
        ms = qk_max_samples(d, 0.85, 8, QK_PRECISION_FP32);
        ms16 = qk_max_samples(d, 0.85, 16, QK_PRECISION_FP32);
        CHECK(ms > prev && ms16 > 0 && ms16 < ms, "%s max_samples: q8 %lld (prev card %lld), q16 %lld", d->name, (long long)ms, (long long)prev, (long long)ms16);
        prev = ms;
        g = gdesc(ms16 - ms16 / 100, 0, QK_OUTPUT_DEVICE);
        CHECK(qk_plan_for_device(d, 0.85, zz16, &g, &p) == QK_OK && p.bulk_states, "%s: n = 0.99 max_samples(16) bulk (%s)", d->name, qk_last_error());
        g = gdesc(ms16 + ms16 / 100 + 1, 0, QK_OUTPUT_DEVICE);
        CHECK(qk_plan_for_device(d, 0.85, zz16, &g, &p) == QK_OK && !p.bulk_states, "%s: n = 1.01 max_samples(16) tiled", d->name);
        CHECK(qk_max_samples(d, 0.4, 16, QK_PRECISION_FP32) < ms16 && qk_max_samples(d, 0.85, 16, QK_PRECISION_FP64) < ms16, "%s: fraction/precision", d->name);
        /* errors */
        g = gdesc(10, 0, QK_OUTPUT_HOST);
        if (zz31) {
            /* beyond the statevector: a local map takes the MPS path (GPU engine, docs/mps.md);
               the statevector, forced, must fail */
            CHECK(qk_plan_for_device(d, 0.85, zz31, &g, &p) == QK_OK && p.backend == QK_BACKEND_CUDA && p.path == QK_PATH_MPS,
                  "%s: 31 qubits zz linear: MPS on the GPU (%s)", d->name, qk_last_error());
            g.path = QK_PATH_COMPLEX;
            CHECK(qk_plan_for_device(d, 0.85, zz31, &g, &p) == QK_ERROR_TOO_MANY_QUBITS, "%s: 31 qubits statevector must fail", d->name);
            g.path = QK_PATH_DEFAULT;
        }
        CHECK(qk_plan_for_device(d, 1.5, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "%s: fraction 1.5 must fail", d->name);
    }
    {   /* a 30-qubit state with scratch does not fit a 24 GB card */
        qk_map *z30 = NULL;
        qk_plan p;
        qk_gram_desc g = gdesc(10, 0, QK_OUTPUT_HOST);
        g.path = QK_PATH_COMPLEX;   /* the statevector (MPS would fit anywhere) */
        CHECK(qk_map_parse("zz(reps=1,ent=linear)", 30, &z30) == QK_OK, "parse zz30");
        CHECK(qk_plan_for_device(&cards[0], 0.85, z30, &g, &p) == QK_ERROR_DEVICE_OUT_OF_MEMORY, "24 GB, 30 qubits: must not fit");
        CHECK(qk_plan_for_device(&cards[2], 0.85, z30, &g, &p) == QK_OK && !p.bulk_states && p.state_tile >= 1 && p.state_tile <= 2, "141 GB, 30 qubits: one or two states per tile");
        qk_map_free(z30);
    }
    precision_modes(cards, zz8, zz4, zz16, hea, angle);
    qk_map_free(zz8); qk_map_free(zz4); qk_map_free(zz20); qk_map_free(zz16);
    qk_map_free(angle); qk_map_free(hea); if (zz31) qk_map_free(zz31);
    printf("%d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
