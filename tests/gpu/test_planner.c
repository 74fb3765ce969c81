/* Planner and VRAM estimator with injected devices (no GPU needed): a 24 GB, an 80 GB and a
   141 GB card. Checks the invariants the CUDA engine relies on: the plan's bytes stay within
   vram_fraction * free, bulk states exactly when they fit, state tiles are powers of two that
   fit, K resident on the device only when it fits, the engine and path by map class and
   qubits, qk_max_samples consistent with the bulk decision, errors for impossible requests. */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "../qk_test.h"

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
    /* the engine: a qk_gpu_engine, its deprecated int mirror equal, named in the plan text */
    CHECK((int)p->engine >= 0 && p->engine < QK_GPU_ENGINE_COUNT && p->use_blas == (int)p->engine, "%s: engine %d use_blas %d", what,
          (int)p->engine, p->use_blas);
    if (p->path == QK_PATH_REAL || p->path == QK_PATH_COMPLEX) {
        char text[2048], want[64];
        /* the plan names the kernel configuration that runs: resolving it again changes nothing */
        CHECK(qk__plan_cfg_runs(p, p->engine, p->kernel_cfg) == p->kernel_cfg && (p->engine != QK_GPU_FUSED || p->kernel_cfg >= 1),
              "%s: engine %s kernel_cfg %d is not the configuration that runs", what, qk__engine_name(p->engine), p->kernel_cfg);
        snprintf(want, sizeof want, "engine: %s, kernel_cfg %d", qk__engine_name(p->engine), p->kernel_cfg);
        CHECK(qk_plan_describe(p, text, sizeof text) > 0 && strstr(text, want), "%s: describe lacks '%s': %s", what, want, text);
    }
    CHECK(strcmp(p->device_name, d->name) == 0, "%s: device name '%s'", what, p->device_name);
}

/* Precision modes (docs/precision.md): which engine each mode gets, the operand bytes counted,
   the fallbacks, FP32 and FP64 plans as before, the autotune's admissible engines, the CPU
   engine's acceptance of every mode. */
static void precision_modes(const qk_device_info *cards, const qk_map *zz8, const qk_map *zz4, const qk_map *zz16,
                            const qk_map *hea, const qk_map *angle)
{
    static const qk_precision tc[3] = {QK_PRECISION_TF32, QK_PRECISION_FP32X3, QK_PRECISION_FP16};
    static const qk_gpu_engine mode[3] = {QK_GPU_TC_TF32, QK_GPU_TC_FP32X3, QK_GPU_TC_FP16}; /* the cuBLAS engines; the fused tensor-core kernel is qk__engine_tcf_of */
    /* the fixed table's engine per mode at 8 and at 6 qubits: the fused tensor-core kernel at 6-7
       qubits in every mode (configuration 2) and at 8 in FP16 (configuration 1); cuBLAS from
       there; FP32X3 starts at 7 qubits (6: the fp32 SIMT kernel) */
    static const qk_gpu_engine at8[3] = {QK_GPU_TC_TF32, QK_GPU_TC_FP32X3, QK_GPU_TCF_FP16},
                               at6[3] = {QK_GPU_TCF_TF32, QK_GPU_FUSED, QK_GPU_TCF_FP16};
    static const double vbytes[3] = {4.0, 8.0, 2.0}; /* operand bytes per real value (FP32X3: 4 fp16 blocks) */
    char buf[1024];
    int c, i, q, b;
    {   /* two GPUs (QK_MGPU_HOST_BOUND_SPLIT off, the default): K on the devices is dealt to
           both, a host-bound K(X,X) (8 qubits to a .npy file or a host buffer) runs on the first */
        qk_device_info two[2];
        qk_plan p;
        qk_gram_desc g = gdesc(65536, 0, QK_OUTPUT_DEVICE);
        two[0] = cards[2]; two[1] = cards[2];
        CHECK(qk_plan_for_devices(two, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 2 && !p.dev_full_rows,
              "2 GPUs zz8 device: %d devices", p.n_devices);
        g = gdesc(65536, 0, QK_OUTPUT_NPY);
        CHECK(qk_plan_for_devices(two, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices <= 1, "2 GPUs zz8 npy: %d devices", p.n_devices);
        g = gdesc(65536, 0, QK_OUTPUT_HOST);
        CHECK(qk_plan_for_devices(two, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices <= 1, "2 GPUs zz8 host: %d devices", p.n_devices);
        g = gdesc(65536, 4099, QK_OUTPUT_HOST);
        CHECK(qk_plan_for_devices(two, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 2, "2 GPUs zz8 K(X,Y) host: %d devices", p.n_devices);
    }
    for (c = 0; c < 3; ++c) {
        const qk_device_info *d = &cards[c];
        qk_plan p, p32;
        qk_gram_desc g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32;
        CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p32) == QK_OK && p32.engine == QK_GPU_CUBLAS, "%s zz8 fp32: engine %d", d->name, (int)p32.engine);
        {   /* a device that runs the wgmma kernels (qk_device_info.wgmma): the fused tensor-core
               kernel's configuration 4 in FP16 and FP32X3, never in TF32; without it, never */
            qk_device_info w = *d;
            qk_map *z7 = NULL;
            w.wgmma = 1;
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = QK_PRECISION_FP16;
            CHECK(qk_plan_for_device(&w, 0.85, zz8, &g, &p) == QK_OK && p.engine == QK_GPU_TCF_FP16 && p.kernel_cfg == 4 &&
                      qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, "wgmma"),
                  "%s wgmma zz8 fp16: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK && p.engine == QK_GPU_TCF_FP16 && p.kernel_cfg == 1,
                  "%s no wgmma zz8 fp16: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            g.precision = QK_PRECISION_FP32X3;
            CHECK(qk_map_parse("zz(reps=2)", 7, &z7) == QK_OK && qk_plan_for_device(&w, 0.85, z7, &g, &p) == QK_OK &&
                      p.engine == QK_GPU_TCF_FP32X3 && p.kernel_cfg == 4,
                  "%s wgmma zz7 fp32x3: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            /* 8 qubits: FP32X3 on the fused kernel's configuration 4 (its TMA triangle) where the
               device runs wgmma, on cuBLAS + epilogue where it does not */
            CHECK(qk_plan_for_device(&w, 0.85, zz8, &g, &p) == QK_OK && p.engine == QK_GPU_TCF_FP32X3 && p.kernel_cfg == 4,
                  "%s wgmma zz8 fp32x3: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK && p.engine == QK_GPU_TC_FP32X3,
                  "%s no wgmma zz8 fp32x3: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            g.precision = QK_PRECISION_AUTO;   /* the default at 8 qubits: fp32x3, so the same kernel */
            CHECK(qk_plan_for_device(&w, 0.85, zz8, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32X3 &&
                      p.engine == QK_GPU_TCF_FP32X3 && p.kernel_cfg == 4,
                  "%s wgmma zz8 auto: precision %d engine %d cfg %d", d->name, (int)p.precision, (int)p.engine, p.kernel_cfg);
            {   /* the few-qubit default: fp32x3 on the TMA kernel from 5 qubits (complex states) where
                   the device runs wgmma; fp32 on the fused kernels below, on a real map, without wgmma */
                int fq;
                for (fq = 2; fq <= 6; ++fq) {
                    qk_map *zq = NULL, *hq = NULL;
                    g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
                    g.precision = QK_PRECISION_AUTO;
                    CHECK(qk_map_parse("zz(reps=2)", fq, &zq) == QK_OK && qk_plan_for_device(&w, 0.85, zq, &g, &p) == QK_OK &&
                              (fq >= 5 ? p.precision == QK_PRECISION_FP32X3 && p.engine == QK_GPU_TCF_FP32X3 && p.kernel_cfg == 4
                                       : p.precision == QK_PRECISION_FP32 && p.engine == QK_GPU_FUSED),
                          "%s wgmma zz%d auto: precision %d engine %d cfg %d [%s]", d->name, fq, (int)p.precision, (int)p.engine, p.kernel_cfg, (qk_plan_describe(&p, buf, sizeof buf), buf));
                    CHECK(qk_plan_for_device(d, 0.85, zq, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32 && p.engine == QK_GPU_FUSED,
                          "%s no wgmma zz%d auto: precision %d engine %d", d->name, fq, (int)p.precision, (int)p.engine);
                    CHECK(qk_map_parse("hea(layers=2,rot=y)", fq, &hq) == QK_OK && qk_plan_for_device(&w, 0.85, hq, &g, &p) == QK_OK &&
                              p.precision == QK_PRECISION_FP32,
                          "%s wgmma real hea%d auto: precision %d engine %d", d->name, fq, (int)p.precision, (int)p.engine);
                    g.precision = QK_PRECISION_FP32;   /* asked for: kept */
                    CHECK(qk_plan_for_device(&w, 0.85, zq, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32 && p.engine == QK_GPU_FUSED,
                          "%s wgmma zz%d fp32: precision %d engine %d", d->name, fq, (int)p.precision, (int)p.engine);
                    qk_map_free(zq);
                    qk_map_free(hq);
                }
            }
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = QK_PRECISION_TF32;
            CHECK(qk_plan_for_device(&w, 0.85, z7, &g, &p) == QK_OK && p.engine == QK_GPU_TCF_TF32 && p.kernel_cfg == 2,
                  "%s wgmma zz7 tf32: engine %d cfg %d", d->name, (int)p.engine, p.kernel_cfg);
            qk_map_free(z7);
        }
        for (i = 0; i < 3; ++i) {
            const double W = 2.0 * 256; /* real values per complex 8-qubit state */
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK, "%s zz8 %s: %s", d->name, qk_precision_name(tc[i]), qk_last_error());
            invariants(&p, d, 0.85, "zz8 tensor cores");
            /* 8 qubits: the cuBLAS tensor-core engine, but FP16 on the fused kernel */
            CHECK(p.engine == at8[i] && p.kernel_cfg == (qk__engine_tcf(at8[i]) ? 1 : 0) && p.precision == tc[i] && p.out_dtype == QK_F32,
                  "%s zz8 %s: engine %d cfg %d precision %d dtype %d", d->name, qk_precision_name(tc[i]), (int)p.engine, p.kernel_cfg,
                  (int)p.precision, (int)p.out_dtype);
            /* the workspace holds the cuBLAS engine's (the autotune may pick it: the complex slab,
               as fp32's, plus the operands, at least the columns and the rotated columns) and the
               fused kernel's (every state's operand words) */
            CHECK((double)p.bytes_workspace >= qk__tcf_ws(qk__engine_tcf_of(mode[i]), 1, 8, 32768.0) &&
                  qk__tcf_ws(qk__engine_tcf_of(mode[i]), 1, 8, 32768.0) >= 32768.0 * W * vbytes[i] / (tc[i] == QK_PRECISION_FP32X3 ? 2.0 : 1.0),
                  "%s zz8 %s: fused operands not counted (%zu)", d->name, qk_precision_name(tc[i]), p.bytes_workspace);
            CHECK((double)p.bytes_workspace >= (double)p.tile_m * 32768.0 * 8.0 + 2.0 * 32768.0 * W * vbytes[i],
                  "%s zz8 %s: workspace %zu too small for the operands", d->name, qk_precision_name(tc[i]), p.bytes_workspace);
            CHECK(p.bytes_workspace > p32.bytes_workspace, "%s zz8 %s: operands not counted", d->name, qk_precision_name(tc[i]));
            CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, qk_precision_name(tc[i])) && strstr(buf, "tensor cores") &&
                  (at8[i] >= 8 ? strstr(buf, "fused") && strstr(buf, "mma.sync") : strstr(buf, "cublas") != NULL),
                  "%s zz8 %s: describe: %s", d->name, qk_precision_name(tc[i]), buf);
            /* K to the host: a ring of two slots, both counted */
            g = gdesc(32768, 0, QK_OUTPUT_HOST);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK && p.engine == at8[i], "%s zz8 host %s: engine %d", d->name, qk_precision_name(tc[i]),
                  (int)p.engine);
            invariants(&p, d, 0.85, "zz8 host tensor cores");
            CHECK(p.tile_m < 32768 && (double)p.bytes_workspace >= 2.0 * qk__blas_ws(mode[i], 1, 8, 4.0, (double)p.tile_m, 32768.0),
                  "%s zz8 host %s: ring workspace %zu", d->name, qk_precision_name(tc[i]), p.bytes_workspace);
            /* few qubits: the fp32 fused kernel, said so */
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, zz4, &g, &p) == QK_OK && p.engine == QK_GPU_FUSED && strstr(p.config, "do not pay"),
                  "%s zz4 %s: blas %d config '%s'", d->name, qk_precision_name(tc[i]), (int)p.engine, p.config);
            /* 6 qubits: TF32 and FP16 on the tensor cores (the fused kernel), FP32X3 (chunked) not yet */
            {
                qk_map *z6 = NULL;
                g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
                g.precision = tc[i];
                CHECK(qk_map_parse("zz(reps=2)", 6, &z6) == QK_OK && qk_plan_for_device(d, 0.85, z6, &g, &p) == QK_OK &&
                      p.engine == at6[i] && (!qk__engine_tcf(at6[i]) || p.kernel_cfg == 2), "%s zz6 %s: engine %d '%s'", d->name,
                      qk_precision_name(tc[i]), (int)p.engine, p.config);
                qk_map_free(z6);
            }
            /* 12 qubits and more: the cuBLAS engine (long GEMMs) in the fixed table; real path,
               product path */
            g = gdesc(16384, 0, QK_OUTPUT_DEVICE);
            g.precision = tc[i];
            CHECK(qk_plan_for_device(d, 0.85, hea, &g, &p) == QK_OK && p.path == QK_PATH_REAL && p.engine == mode[i], "%s hea %s: blas %d",
                  d->name, qk_precision_name(tc[i]), (int)p.engine);
            CHECK(qk_plan_for_device(d, 0.85, angle, &g, &p) == QK_OK && p.path == QK_PATH_ANALYTIC && p.engine == QK_GPU_FUSED, "%s angle %s",
                  d->name, qk_precision_name(tc[i]));
        }
        /* FP32 and FP64 keep their engines at every qubit count (FP32 results unchanged) */
        for (q = 2; q <= 20; q += 3) {
            qk_map *m = NULL;
            if (qk_map_parse("zz(reps=2)", q, &m) != QK_OK) { CHECK(0, "parse zz %d", q); continue; }
            g = gdesc(q <= 12 ? 4096 : 256, 0, QK_OUTPUT_DEVICE);
            g.precision = QK_PRECISION_FP32;
            CHECK(qk_plan_for_device(d, 0.85, m, &g, &p) == QK_OK && p.engine == (q >= 7 ? QK_GPU_CUBLAS : QK_GPU_FUSED) && p.precision == QK_PRECISION_FP32,
                  "%s zz%d fp32: blas %d", d->name, q, (int)p.engine);
            g.precision = QK_PRECISION_FP64;
            CHECK(qk_plan_for_device(d, 0.85, m, &g, &p) == QK_OK && p.engine == (q >= 7 ? QK_GPU_CUBLAS : QK_GPU_FUSED) && p.out_dtype == QK_F64,
                  "%s zz%d fp64: blas %d", d->name, q, (int)p.engine);
            qk_map_free(m);
        }
    }
    {   /* FP32X3 operands (8x the states) that do not fit a 24 GB card: the fp32 cuBLAS engine */
        qk_plan p;
        qk_gram_desc g;
        int64_t n = qk_max_samples(&cards[0], 0.85, 16, QK_PRECISION_FP32) * 9 / 10;
        g = gdesc(n, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32X3;
        CHECK(qk_plan_for_device(&cards[0], 0.85, zz16, &g, &p) == QK_OK && p.engine == QK_GPU_CUBLAS && strstr(p.config, "exceed"),
              "24 GB zz16 n=%lld fp32x3: blas %d config '%s' (%s)", (long long)n, (int)p.engine, p.config, qk_last_error());
        invariants(&p, &cards[0], 0.85, "zz16 fp32x3 fallback");
        /* n = 4096 on the 141 GB card fits (26 GB of operands) */
        g = gdesc(4096, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_FP32X3;
        CHECK(qk_plan_for_device(&cards[2], 0.85, zz16, &g, &p) == QK_OK && p.engine == QK_GPU_TC_FP32X3 && p.tile_m == 4096,
              "141 GB zz16 n=4096 fp32x3: blas %d slab %lld", (int)p.engine, (long long)p.tile_m);
        invariants(&p, &cards[2], 0.85, "zz16 fp32x3 141 GB");
    }
    {   /* more than 24 qubits: no tensor-core engine */
        qk_map *z25 = NULL;
        qk_plan p;
        qk_gram_desc g = gdesc(8, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_TF32;
        g.path = QK_PATH_COMPLEX;   /* the statevector (the planner would take MPS for this local map) */
        CHECK(qk_map_parse("zz(reps=1,ent=linear)", 25, &z25) == QK_OK, "parse zz25");
        CHECK(z25 && qk_plan_for_device(&cards[2], 0.85, z25, &g, &p) == QK_OK && p.engine == QK_GPU_CUBLAS && strstr(p.config, "24 qubits"),
              "zz25 tf32: blas %d '%s'", (int)p.engine, p.config);
        qk_map_free(z25);
    }
    /* the configuration that runs (docs/gpu.md): the few-qubit tensor-core kernel (8) takes complex
       fp32 states with float K at 2..6 qubits, else the persistent SIMT kernel (7) at up to 5,
       else 64x64 (1); the removed 3, 5 and 6 run as 1, 2 and 4 as themselves; the fused
       tensor-core kernel's FP32X3 runs configuration 2 */
    CHECK(qk__fused_cfg_runs(8, 6, 0, 1, 1) == 8 && qk__fused_cfg_runs(8, 2, 0, 1, 1) == 8, "cfg 8 at 2..6 qubits");
    CHECK(qk__fused_cfg_runs(8, 1, 0, 1, 1) == 7 && qk__fused_cfg_runs(8, 7, 0, 1, 1) == 1, "cfg 8 -> 7 at 1 qubit, -> 1 at 7");
    CHECK(qk__fused_cfg_runs(7, 5, 0, 1, 1) == 7 && qk__fused_cfg_runs(7, 6, 0, 1, 1) == 1, "cfg 7 up to 5 qubits");
    CHECK(qk__fused_cfg_runs(8, 4, 1, 1, 0) == 1 && qk__fused_cfg_runs(8, 4, 0, 0, 1) == 1 && qk__fused_cfg_runs(8, 4, 0, 1, 0) == 1,
          "cfg 8 needs complex fp32 states and float K");
    for (b = 1; b <= QK__N_FUSED_CFG; ++b)
        CHECK(qk__fused_cfg_kept(b) == (b != 3 && b != 5 && b != 6) &&
              (qk__fused_cfg_kept(b) || (qk__fused_cfg_runs(b, 8, 0, 1, 1) == 1 && qk__fused_cfg_runs(b, 8, 1, 0, 0) == 1)),
              "cfg %d: kept %d, runs %d", b, qk__fused_cfg_kept(b), qk__fused_cfg_runs(b, 8, 0, 1, 1));
    CHECK(qk__fused_cfg_runs(2, 8, 1, 1, 0) == 2 && qk__fused_cfg_runs(4, 8, 0, 0, 0) == 4, "cfg 2 and 4 run as themselves");
    CHECK(qk__fused_cfg_runs(0, 8, 0, 1, 1) == qk__fused_cfg_fixed(8, 0, 1, 1) && qk__fused_cfg_runs(9, 8, 0, 1, 1) == 1, "cfg 0, 9");
    CHECK(qk__tcf_cfg_runs(QK_GPU_TCF_FP32X3, 3) == 2 && qk__tcf_cfg_runs(QK_GPU_TCF_FP16, 2) == 2 && qk__tcf_cfg_runs(QK_GPU_TCF_FP16, 3) == 1 &&
          qk__tcf_cfg_runs(QK_GPU_TCF_TF32, 0) == 1, "fused tensor-core configurations");
    CHECK(qk__tcf_cfg_runs(QK_GPU_TCF_FP16, 4) == 4 && qk__tcf_cfg_runs(QK_GPU_TCF_FP32X3, 4) == 4 && qk__tcf_cfg_runs(QK_GPU_TCF_TF32, 4) == 1,
          "configuration 4 (wgmma): fp16 and fp32x3, tf32 runs 1");
    /* engines the autotune may apply per precision: never a less accurate one */
    for (b = 0; b <= 10; ++b) {
        CHECK(qk__blas_ok(QK_PRECISION_FP32, QK_PATH_COMPLEX, (qk_gpu_engine)b) == (b <= 2), "fp32 complex engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP32, QK_PATH_REAL, (qk_gpu_engine)b) == (b <= 1), "fp32 real engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP64, QK_PATH_COMPLEX, (qk_gpu_engine)b) == (b <= 1 || b == 7), "fp64 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_TF32, QK_PATH_COMPLEX, (qk_gpu_engine)b) == (b <= 3 || b == 8), "tf32 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP32X3, QK_PATH_COMPLEX, (qk_gpu_engine)b) == (b <= 2 || b == 4 || b == 9), "fp32x3 engine %d", b);
        CHECK(qk__blas_ok(QK_PRECISION_FP16, QK_PATH_REAL, (qk_gpu_engine)b) == (b <= 1 || b == 5 || b == 10), "fp16 real engine %d", b);
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
        for (i = QK_PRECISION_TF32; i <= QK_PRECISION_FP16; ++i) {
            memset(kt, 0xff, sizeof kt);
            g.out = kt; g.precision = (qk_precision)i;
            CHECK(cpu && qk_plan_make(cpu, zz4, &g, &p) == QK_OK && p.backend == QK_BACKEND_CPU && p.precision == QK_PRECISION_FP64 &&
                  p.out_dtype == QK_F32 && strstr(p.config, "fp64") && strstr(p.config, qk_precision_name((qk_precision)i)),
                  "cpu plan %s: '%s'", qk_precision_name((qk_precision)i), p.config);
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_OK && memcmp(kt, k32, sizeof kt) == 0, "cpu %s: K differs from fp32's", qk_precision_name((qk_precision)i));
        }
        {   /* AUTO on the CPU engine: fp64 (meets any tol), float64 out like the default, said so */
            double k64[37 * 37], kd[37 * 37];
            g.out = kd; g.precision = QK_PRECISION_DEFAULT; g.out_dtype = QK_DTYPE_DEFAULT;
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_OK, "cpu default: %s", qk_last_error());
            g.out = k64; g.precision = QK_PRECISION_AUTO; g.tol = 1e-2;
            CHECK(cpu && qk_plan_make(cpu, zz4, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP64 && p.out_dtype == QK_F64 &&
                  strstr(p.precision_note, "auto") && strstr(p.precision_note, "computes in fp64") && p.error_bound == 1e-10,
                  "cpu plan auto: '%s'", p.precision_note);
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_OK && memcmp(k64, kd, sizeof kd) == 0, "cpu auto: K differs from the default's");
            g.tol = -1.0;
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_ERROR_INVALID_ARGUMENT, "tol -1 must fail");
            g.tol = 0.0 / 0.0;
            CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_ERROR_INVALID_ARGUMENT, "tol NaN must fail");
            g.tol = 0.0;
            g.out = kt; g.out_dtype = QK_DTYPE_DEFAULT;
        }
        g.precision = (qk_precision)QK_PRECISION_COUNT;
        CHECK(cpu && qk_gram(cpu, zz4, &g) == QK_ERROR_INVALID_ARGUMENT, "unknown precision must fail");
        qk_ctx_destroy(cpu);
    }
}

/* --precision auto: the stated bounds (docs/precision.md) and the choice by tolerance, with
   injected devices. The bound formula is recomputed here from its documented terms. */
static void auto_precision(const qk_device_info *cards, const qk_map *zz8, const qk_map *zz4, const qk_map *hea,
                           const qk_map *angle)
{
    /* Gauss's product: e_p + 2^-23 on Re, three times it on Im (docs/precision.md) */
    const double u = ldexp(1.0, -11), e16 = 2.0 * u + u * u + ldexp(1.0, -23), e3 = 3.0 * ldexp(1.0, -22) + ldexp(1.0, -23);
    qk_plan p;
    qk_gram_desc g;
    char buf[2048];
    int q, c;
    /* the bounds */
    for (q = 1; q <= 30; ++q) {
        const double b32 = 1e-4 * (1.0 + q / 4.0) + ldexp(1.0, q - 24) / 4.0 + 1e-4;
        CHECK(fabs(qk_precision_error_bound(QK_PRECISION_FP32, q) - b32) <= 1e-15, "fp32 bound q=%d", q);
        CHECK(fabs(qk_precision_error_bound(QK_PRECISION_TF32, q) - (b32 + 2.0 * sqrt(10.0) * e16 + 10.0 * e16 * e16)) <= 1e-15, "tf32 bound q=%d", q);
        CHECK(qk_precision_error_bound(QK_PRECISION_FP16, q) == qk_precision_error_bound(QK_PRECISION_TF32, q), "fp16 bound q=%d", q);
        CHECK(fabs(qk_precision_error_bound(QK_PRECISION_FP32X3, q) - (b32 + 2.0 * sqrt(10.0) * e3 + 10.0 * e3 * e3)) <= 1e-15, "fp32x3 bound q=%d", q);
        /* fp32x3's bound within 2x fp32's (issue 12) */
        CHECK(qk_precision_error_bound(QK_PRECISION_FP32X3, q) <= 2.0 * b32, "fp32x3 bound q=%d above 2x fp32's", q);
        CHECK(qk_precision_error_bound(QK_PRECISION_FP64, q) == 1e-10, "fp64 bound q=%d", q);
    }
    CHECK(qk_precision_error_bound(QK_PRECISION_AUTO, 8) < 0 && qk_precision_error_bound(QK_PRECISION_DEFAULT, 8) < 0 &&
          qk_precision_error_bound((qk_precision)99, 8) < 0 && qk_precision_error_bound(QK_PRECISION_FP32, -1) < 0, "bound of no mode: -1");
    for (c = 0; c < 3; ++c) {
        const qk_device_info *d = &cards[c];
        static const struct { qk_precision asked; double tol; qk_precision want; qk_gpu_engine blas; } zz8c[] = {
            {QK_PRECISION_DEFAULT, 0.0, QK_PRECISION_FP32X3, QK_GPU_TC_FP32X3},  /* the GPU default: auto, fp32-class (fp32x3's bound): fp32x3 */
            {QK_PRECISION_AUTO, 0.0, QK_PRECISION_FP32X3, QK_GPU_TC_FP32X3},
            {QK_PRECISION_AUTO, 1e-3, QK_PRECISION_FP32X3, QK_GPU_TC_FP32X3},    /* 1e-3: above fp32x3's 4.1e-4, under fp16's 6.6e-3 */
            {QK_PRECISION_AUTO, 1e-2, QK_PRECISION_FP16, QK_GPU_TCF_FP16},       /* the fastest, tf32's equal bound never wins (fused at 8 q) */
            {QK_PRECISION_DEFAULT, 1e-2, QK_PRECISION_FP16, QK_GPU_TCF_FP16},    /* tol with the default precision: auto */
            {QK_PRECISION_AUTO, 4.05e-4, QK_PRECISION_FP32, QK_GPU_CUBLAS},      /* between fp32's 4.04e-4 and fp32x3's 4.09e-4 */
            {QK_PRECISION_AUTO, 1e-6, QK_PRECISION_FP64, QK_GPU_CUBLAS},         /* tighter than fp32: fp64 */
            {QK_PRECISION_AUTO, 1e-12, QK_PRECISION_FP64, QK_GPU_CUBLAS},        /* tighter than any: fp64, said so */
            {QK_PRECISION_TF32, 0.0, QK_PRECISION_TF32, QK_GPU_TC_TF32},         /* named modes are kept (TF32 at 8 qubits: cuBLAS) */
        };
        size_t i;
        for (i = 0; i < sizeof zz8c / sizeof zz8c[0]; ++i) {
            g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
            g.precision = zz8c[i].asked;
            g.tol = zz8c[i].tol;
            CHECK(qk_plan_for_device(d, 0.85, zz8, &g, &p) == QK_OK, "%s auto %zu: %s", d->name, i, qk_last_error());
            invariants(&p, d, 0.85, "zz8 auto");
            CHECK(p.precision == zz8c[i].want && p.engine == zz8c[i].blas, "%s zz8 asked %s tol %g: %s blas %d (want %s blas %d) '%s'", d->name,
                  qk_precision_name(zz8c[i].asked), zz8c[i].tol, qk_precision_name(p.precision), (int)p.engine, qk_precision_name(zz8c[i].want),
                  zz8c[i].blas, p.precision_note);
            CHECK(p.out_dtype == (zz8c[i].want == QK_PRECISION_FP64 ? QK_F64 : QK_F32), "%s zz8 auto %zu: dtype %d", d->name, i, (int)p.out_dtype);
            CHECK(p.error_bound == qk_precision_error_bound(p.precision, 8), "%s zz8 auto %zu: plan bound %g", d->name, i, p.error_bound);
            if (zz8c[i].asked == QK_PRECISION_AUTO || zz8c[i].asked == QK_PRECISION_DEFAULT) {
                /* the plan says which mode and why, numbers locale-free */
                CHECK(strstr(p.precision_note, "auto: ") && strstr(p.precision_note, qk_precision_name(zz8c[i].want)) &&
                      (zz8c[i].want == QK_PRECISION_FP64 || p.error_bound <= p.tol) && p.tol > 0,
                      "%s zz8 auto %zu: note '%s' tol %g", d->name, i, p.precision_note, p.tol);
                CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, "precision: auto: "), "%s auto %zu: describe: %s", d->name, i, buf);
                if (zz8c[i].tol == 0.0) CHECK(strstr(p.precision_note, "default"), "%s auto %zu: default tol said: '%s'", d->name, i, p.precision_note);
            } else CHECK(p.precision_note[0] == 0 && p.tol == 0.0, "%s named mode: no auto note '%s'", d->name, p.precision_note);
        }
        /* 4 qubits: the tensor cores do not apply: fp32 even with a loose tol; product maps too */
        g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_AUTO;
        g.tol = 1e-2;
        CHECK(qk_plan_for_device(d, 0.85, zz4, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32 && p.engine == QK_GPU_FUSED,
              "%s zz4 auto 1e-2: %s blas %d", d->name, qk_precision_name(p.precision), (int)p.engine);
        CHECK(qk_plan_for_device(d, 0.85, angle, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32 && p.path == QK_PATH_ANALYTIC,
              "%s angle auto 1e-2: %s", d->name, qk_precision_name(p.precision));
        /* the MPS path (40 qubits, linear zz: bond 2): the default is fp32 with the MPS GPU suite's
           bound 2e-6 + 5e-7 q chi stated and said; a tol under it takes fp64 (double kernels) */
        {
            qk_map *z40 = NULL;
            const double b = 2e-6 + 5e-7 * 40.0 * 2.0;
            g = gdesc(512, 0, QK_OUTPUT_DEVICE);
            CHECK(qk_map_parse("zz(reps=1,ent=linear)", 40, &z40) == QK_OK && qk_plan_for_device(d, 0.85, z40, &g, &p) == QK_OK &&
                      p.path == QK_PATH_MPS && p.precision == QK_PRECISION_FP32 && fabs(p.error_bound - b) < 1e-12 && fabs(p.tol - b) < 1e-12 &&
                      strstr(p.precision_note, "auto: fp32") && strstr(p.precision_note, "default"),
                  "%s mps default: path %d %s bound %g tol %g '%s'", d->name, (int)p.path, qk_precision_name(p.precision), p.error_bound, p.tol,
                  p.precision_note);
            g.precision = QK_PRECISION_AUTO;
            g.tol = 1e-6;
            CHECK(z40 && qk_plan_for_device(d, 0.85, z40, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP64 && p.error_bound <= 1e-6 &&
                      strstr(p.precision_note, "auto: fp64"),
                  "%s mps auto 1e-6: %s bound %g '%s'", d->name, qk_precision_name(p.precision), p.error_bound, p.precision_note);
            g.precision = QK_PRECISION_FP32;
            g.tol = 0.0;
            CHECK(z40 && qk_plan_for_device(d, 0.85, z40, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32 && p.error_bound == b &&
                      p.precision_note[0] == 0, "%s mps fp32: bound %g '%s'", d->name, p.error_bound, p.precision_note);
            qk_map_free(z40);
        }
        /* hea 12 qubits (real): fp16 on the cuBLAS engine (fixed table), fp32x3 at 1e-3 */
        g = gdesc(16384, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_AUTO;
        g.tol = 1e-2;
        CHECK(qk_plan_for_device(d, 0.85, hea, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP16 && p.engine == QK_GPU_TC_FP16,
              "%s hea auto 1e-2: %s blas %d", d->name, qk_precision_name(p.precision), (int)p.engine);
        g.tol = 1e-3;
        CHECK(qk_plan_for_device(d, 0.85, hea, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32X3 && p.engine == QK_GPU_TC_FP32X3,
              "%s hea auto 1e-3: %s blas %d", d->name, qk_precision_name(p.precision), (int)p.engine);
    }
    /* 6 qubits on these cards (no wgmma): fp32x3 does not run on the tensor cores (from 7; from 5 with
       wgmma, checked above), so 1e-3 keeps fp32 */
    {
        qk_map *z6 = NULL, *z7 = NULL;
        CHECK(qk_map_parse("zz(reps=2)", 6, &z6) == QK_OK && qk_map_parse("zz(reps=2)", 7, &z7) == QK_OK, "parse zz6/7");
        g = gdesc(4096, 0, QK_OUTPUT_DEVICE);
        g.precision = QK_PRECISION_AUTO;
        g.tol = 1e-3;
        CHECK(z6 && qk_plan_for_device(&cards[2], 0.85, z6, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32, "zz6 auto 1e-3: %s", qk_precision_name(p.precision));
        CHECK(z7 && qk_plan_for_device(&cards[2], 0.85, z7, &g, &p) == QK_OK && p.precision == QK_PRECISION_FP32X3, "zz7 auto 1e-3: %s", qk_precision_name(p.precision));
        qk_map_free(z6);
        qk_map_free(z7);
    }
    /* bad tolerances and precisions */
    g = gdesc(100, 0, QK_OUTPUT_DEVICE);
    g.precision = QK_PRECISION_AUTO;
    g.tol = -1e-3;
    CHECK(qk_plan_for_device(&cards[0], 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "tol < 0 must fail");
    g.tol = 1.0 / 0.0;
    CHECK(qk_plan_for_device(&cards[0], 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "tol inf must fail");
    g.tol = 0.0;
    g.precision = (qk_precision)QK_PRECISION_COUNT;
    CHECK(qk_plan_for_device(&cards[0], 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "precision COUNT must fail");
}

/* Density matrices (qk_gram_states with a_mixed / b_mixed) on a GPU: the plan is linear (K = the
   inner product of the vectorised matrices, not its square) and names an engine that honours it:
   the cuBLAS real engine with the linear epilogue, or its tensor-core form where the mode runs on
   the tensor cores (fp16 and tf32 from 6 qubits of the vector, fp32x3 from 7; below, fp32, said in
   the config), never the fused kernels (they square), without the autotune; auto and the default
   choose among the tensor-core modes as for pure states; pure states of the same sizes keep their
   engines (not linear). Several GPUs: every part linear on cuBLAS. */
static void mixed_states(const qk_device_info *cards)
{
    static double rho[2 * 16 * 16 * 4];
    const qk_precision precs[] = {QK_PRECISION_DEFAULT, QK_PRECISION_AUTO, QK_PRECISION_FP64, QK_PRECISION_FP32,
                                  QK_PRECISION_FP32X3, QK_PRECISION_TF32, QK_PRECISION_FP16};
    const int dims[] = {4, 16};   /* vectors of 32 and 512 reals: 5 and 9 qubits */
    qk_ctx *cpu = qk_test_ctx(QK_DEVICE_CPU, 1);
    int di, c, k, mixed, sym;
    for (k = 0; k < 4; k++) {   /* identity / 16 (only the pointer and sizes matter to the planner) */
        int a;
        for (a = 0; a < 16; a++) rho[2 * (k * 256 + a * 16 + a)] = 1.0 / 16;
    }
    for (di = 0; di < 2; di++)
        for (mixed = 0; mixed <= 1; mixed++)
            for (sym = 0; sym <= 1; sym++) {
                const int dim = dims[di], q = di == 0 ? (mixed ? 5 : 2) : (mixed ? 9 : 4);
                qk_states_desc st;
                qk__smap sm;
                qk_gram_desc g, in;
                size_t i;
                memset(&st, 0, sizeof st);
                st.type = QK_STATE_C128;
                st.dim = dim;
                st.a = rho; st.n_a = 4; st.lda = mixed ? dim * dim : dim; st.a_mixed = mixed;
                if (!sym) { st.b = rho; st.n_b = 4; st.ldb = st.lda; st.b_mixed = mixed; }
                st.normalize = 1;   /* the planner reads no entry; the map is what it plans */
                memset(&in, 0, sizeof in);
                in.out = rho;
                if (qk__smap_make(cpu, &st, &in, "test", &sm, &g) != QK_OK) { CHECK(0, "smap: %s", qk_last_error()); continue; }
                g.n_x = 3000;
                if (!sym) g.n_y = 1700;
                CHECK(sm.map.n_qubits == q, "dim %d mixed %d: %d qubits (want %d)", dim, mixed, sm.map.n_qubits, q);
                for (c = 0; c < 3; c++)
                    for (i = 0; i < sizeof precs / sizeof precs[0]; i++) {
                        qk_plan p;
                        char txt[4096];
                        const int tc = precs[i] == QK_PRECISION_FP32X3 || precs[i] == QK_PRECISION_TF32 || precs[i] == QK_PRECISION_FP16;
                        g.precision = precs[i];
                        g.tol = precs[i] == QK_PRECISION_AUTO ? 1e-2 : 0.0;   /* a tolerance fp16 would meet */
                        if (qk_plan_for_device(&cards[c], 0.85, &sm.map, &g, &p) != QK_OK) {
                            CHECK(0, "%s dim %d mixed %d %s: %s", cards[c].name, dim, mixed, qk_precision_name(precs[i]), qk_last_error());
                            continue;
                        }
                        qk_plan_describe(&p, txt, sizeof txt);
                        if (!mixed) {
                            CHECK(!p.linear && !strstr(p.config, "linear"), "pure dim %d %s: plan.linear %d config '%s'", dim,
                                  qk_precision_name(precs[i]), p.linear, p.config);
                            continue;
                        }
                        {
                            /* the mode that runs: auto with tol 1e-2 takes fp16 where the tensor cores run
                               (from 6 qubits; fp32x3 from 7), the default fp32x3 from 7 qubits, else fp32 */
                            const qk_precision run = precs[i] == QK_PRECISION_AUTO ? (q >= 6 ? QK_PRECISION_FP16 : QK_PRECISION_FP32)
                                                     : precs[i] == QK_PRECISION_DEFAULT ? (q >= 7 ? QK_PRECISION_FP32X3 : QK_PRECISION_FP32)
                                                     : precs[i];
                            const int on_tc = (run == QK_PRECISION_FP32X3 && q >= 7) || ((run == QK_PRECISION_TF32 || run == QK_PRECISION_FP16) && q >= 6);
                            const qk_gpu_engine want = !on_tc ? QK_GPU_CUBLAS : run == QK_PRECISION_FP16 ? QK_GPU_TC_FP16
                                                       : run == QK_PRECISION_TF32 ? QK_GPU_TC_TF32 : QK_GPU_TC_FP32X3;
                            CHECK(p.backend == QK_BACKEND_CUDA && p.linear == 1 && p.path == QK_PATH_REAL && p.engine == want && p.precision == run,
                                  "%s dim %d %s %s: backend %d linear %d path %d engine %d precision %s (want CUDA, 1, real, %d, %s)", cards[c].name,
                                  dim, sym ? "K(A,A)" : "K(A,B)", qk_precision_name(precs[i]), (int)p.backend, p.linear, (int)p.path,
                                  (int)p.engine, qk_precision_name(p.precision), (int)want, qk_precision_name(run));
                            CHECK(strstr(txt, on_tc ? "engine: tc-" : "engine: cublas") && strstr(txt, "linear epilogue: Tr(rho_i rho_j)") &&
                                  strstr(txt, on_tc ? (sym ? "tensor cores, real form, triangle blocks" : "tensor cores, real form, gemm")
                                                    : sym ? "syrk+gemm" : "gemm"),
                                  "dim %d %s: describe says the linear cuBLAS engine:\n%s", dim, qk_precision_name(precs[i]), txt);
                            CHECK(!tc || on_tc || strstr(p.config, "no tensor cores, < "),
                                  "dim %d %s: a tensor-core mode below its qubits runs fp32 and says so: '%s'", dim, qk_precision_name(precs[i]), p.config);
                            CHECK(strlen(p.config) < sizeof p.config - 1, "dim %d %s: config cut short: '%s'", dim, qk_precision_name(precs[i]), p.config);
                        }
                        CHECK(p.error_bound == qk_precision_error_bound(p.precision, q) && p.error_bound > 0,
                              "dim %d %s: error bound %g (want the mode's at %d qubits)", dim, qk_precision_name(precs[i]), p.error_bound, q);
#if defined(QK_CUDA) && QK_CUDA
                        /* the autotune (mode 1: tune now) leaves a linear plan as the planner made it, without timing anything */
                        {
                        const qk_gpu_engine e0 = p.engine;
                        qk__plan_autotune(&cards[c], 1, "/nonexistent-qk-cache", NULL, NULL, &p);
                        CHECK(p.engine == e0 && strstr(p.config, "linear epilogue"),
                              "dim %d %s: the autotune leaves a linear plan's engine (engine %d, '%s')", dim, qk_precision_name(precs[i]),
                              (int)p.engine, p.config);
                        }
#endif
                    }
                if (mixed) {   /* two GPUs: every part planned linear on cuBLAS (the part's plan carries plan.linear) */
                    qk_device_info two[2];
                    qk_plan p;
                    int j;
                    two[0] = cards[1]; two[1] = cards[1];
                    g.precision = QK_PRECISION_FP32;
                    g.mgpu_min_pairs = 1;
                    g.mgpu_host_bound_split = 1;   /* K(A,A) to the host too */
                    if (qk_plan_for_devices(two, NULL, 2, 0.85, &sm.map, &g, &p) != QK_OK) CHECK(0, "two GPUs: %s", qk_last_error());
                    else {
                        CHECK(p.n_devices == 2 && p.n_parts >= 2 && p.linear, "two GPUs dim %d: %d devices, %d parts, linear %d", dim,
                              p.n_devices, p.n_parts, p.linear);
                        for (j = 0; j < p.n_parts; j++) {
                            qk_plan sp;
                            qk__plan_part_plan(&p, j, cards[1].name, &sp);
                            CHECK(sp.linear && sp.engine == QK_GPU_CUBLAS, "two GPUs dim %d part %d: linear %d engine %d", dim, j,
                                  sp.linear, (int)sp.engine);
                        }
                    }
                    g.mgpu_min_pairs = 0;
                    g.mgpu_host_bound_split = 0;
                }
                qk__smap_free(&sm);
            }
    qk_ctx_destroy(cpu);
}

/* A small host budget on many threads: the CPU plan takes fewer threads where their scratch
   leaves no room for two states (16 threads' scratch alone is past 2 MB at 9 qubits), instead of
   failing; K the same bits as a context with its own budget (the CPU engine's sums do not depend
   on the thread count). */
static void cpu_threads_budget(void)
{
    qk_map *m = NULL;
    qk_ctx_desc cd;
    qk_ctx *small = NULL, *big = NULL;
    qk_gram_desc g;
    qk_plan p;
    const int64_t n = 300;
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * 9)), *K1 = (double *)malloc(sizeof(double) * (size_t)(n * n)),
           *K2 = (double *)malloc(sizeof(double) * (size_t)(n * n));
    int64_t i;
    CHECK(qk_map_parse("zz(reps=2)", 9, &m) == QK_OK && x && K1 && K2, "threads budget: setup");
    for (i = 0; i < n * 9; i++) x[i] = qk_test_uniform(0, 6.28);
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = 16;
    cd.host_memory = (size_t)2 << 20;
    CHECK(qk_ctx_create(&cd, &small) == QK_OK, "threads budget: ctx %s", qk_last_error());
    cd.host_memory = 0;
    cd.n_threads = 2;
    CHECK(qk_ctx_create(&cd, &big) == QK_OK, "threads budget: ctx %s", qk_last_error());
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = n; g.out_dtype = QK_F64;
    if (small && big && qk_plan_make(small, m, &g, &p) == QK_OK) {
        CHECK(p.n_threads >= 1 && p.n_threads < 16 && !p.bulk_states && (double)p.bytes_total <= (double)((size_t)2 << 20),
              "threads budget: %d threads, bulk %d, %.0f bytes planned of 2 MB", p.n_threads, p.bulk_states, (double)p.bytes_total);
        g.out = K1;
        CHECK(qk_gram(small, m, &g) == QK_OK, "threads budget: gram %s", qk_last_error());
        g.out = K2;
        CHECK(qk_gram(big, m, &g) == QK_OK, "threads budget: gram %s", qk_last_error());
        CHECK(!memcmp(K1, K2, sizeof(double) * (size_t)(n * n)), "threads budget: K differs from the unbudgeted context's");
    } else CHECK(0, "threads budget: plan %s", qk_last_error());
    qk_ctx_destroy(small);
    qk_ctx_destroy(big);
    qk_map_free(m);
    free(x); free(K1); free(K2);
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
    if (qk_test_fails) return 1;
    cpu_threads_budget();

    {   /* precision names: the one table, name <-> parse round trip; bad names are errors */
        int k;
        qk_precision pr = QK_PRECISION_FP16;
        for (k = 0; k < QK_PRECISION_COUNT; k++) {
            qk_precision back = (qk_precision)-1;
            CHECK(qk_precision_parse(qk_precision_name((qk_precision)k), &back) == QK_OK && back == (qk_precision)k,
                  "precision %d: name '%s' does not parse back", k, qk_precision_name((qk_precision)k));
        }
        CHECK(!strcmp(qk_precision_name(QK_PRECISION_FP32X3), "fp32x3") && !strcmp(qk_precision_name(QK_PRECISION_AUTO), "auto"),
              "precision names");
        CHECK(!strcmp(qk_precision_name((qk_precision)QK_PRECISION_COUNT), "?") && !strcmp(qk_precision_name((qk_precision)-1), "?"),
              "out-of-range precision name");
        CHECK(qk_precision_parse("FP32", &pr) == QK_ERROR_INVALID_ARGUMENT && pr == QK_PRECISION_FP16, "'FP32' parsed or *out touched");
        CHECK(qk_precision_parse("fp3", &pr) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "fp32x3"), "'fp3': %s", qk_last_error());
        CHECK(qk_precision_parse(NULL, &pr) == QK_ERROR_INVALID_ARGUMENT && pr == QK_PRECISION_FP16, "NULL name");
        CHECK(qk_precision_parse("fp32", NULL) == QK_ERROR_INVALID_ARGUMENT, "NULL out");
    }

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
        CHECK(p.bulk_states && p.k_resident && p.engine != QK_GPU_FUSED && p.path == QK_PATH_COMPLEX && p.symmetric, "%s zz8: bulk %d resident %d blas %d path %d",
              d->name, p.bulk_states, p.k_resident, (int)p.engine, (int)p.path);
        CHECK(p.precision == QK_PRECISION_FP32X3 && p.engine == QK_GPU_TC_FP32X3 && p.out_dtype == QK_F32,
              "%s zz8: default precision (fp32-class: fp32x3) / dtype", d->name);
        CHECK(p.bytes_staging > 0 && p.tile_m < 32768, "%s zz8 host: staging %zu slab %lld (pipelined)", d->name, p.bytes_staging, (long long)p.tile_m);
        CHECK(qk_plan_describe(&p, buf, sizeof buf) > 0 && strstr(buf, d->name), "%s: describe", d->name);
        /* zz 4 qubits on the device: the fused kernel, one slab */
        g = gdesc(32768, 0, QK_OUTPUT_DEVICE);
        CHECK(qk_plan_for_device(d, 0.85, zz4, &g, &p) == QK_OK, "%s zz4: %s", d->name, qk_last_error());
        invariants(&p, d, 0.85, "zz4 device");
        CHECK(p.engine == QK_GPU_FUSED && p.tile_m == 32768 && p.bytes_out == 0, "%s zz4: blas %d slab %lld out %zu", d->name, (int)p.engine, (long long)p.tile_m, p.bytes_out);
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
    {   /* the engine's out-of-memory retries: the planner's shrink sequence, from a resident K
           to a host buffer with 1024-row slabs and bulk states: residency given up first, slabs
           halved to 64, then state tiles 8192 .. 64 (slabs never taller than a tile), then none */
        qk_plan p;
        int steps = 0, ok = 1;
        int64_t prev_slab = 1024, prev_tile = (int64_t)1 << 40;
        memset(&p, 0, sizeof p);
        p.symmetric = 1; p.output = QK_OUTPUT_HOST; p.k_resident = 1; p.bulk_states = 1; p.tile_m = 1024;
        CHECK(qk__plan_mirror(&p), "shrink: K resident, symmetric: mirrored");
        CHECK(qk__plan_shrink(&p) && !p.k_resident && p.tile_m == 1024 && p.bulk_states, "shrink 1: residency given up first");
        CHECK(!qk__plan_mirror(&p), "shrink: a ring of host slabs computes whole rows (no mirror)");
        while (qk__plan_shrink(&p)) {
            const int64_t tile = p.bulk_states ? (int64_t)1 << 40 : p.state_tile;
            ++steps;
            ok &= (p.tile_m < prev_slab && tile == prev_tile) || (p.tile_m <= tile && tile < prev_tile && !p.bulk_states);
            ok &= p.tile_m >= 64 && p.tile_m <= tile;
            prev_slab = p.tile_m; prev_tile = tile;
            if (steps > 100) break;
        }
        CHECK(ok && steps == 4 + 8 && p.tile_m == 64 && p.state_tile == 64 && !p.bulk_states,
              "shrink: %d steps (4 slab halvings and 8 tiles, 8192 .. 64, expected), ending at slab %lld, tile %lld", steps,
              (long long)p.tile_m, (long long)p.state_tile);
        memset(&p, 0, sizeof p);
        p.symmetric = 1; p.output = QK_OUTPUT_DEVICE; p.k_resident = 0; p.tile_m = 64; p.bulk_states = 0; p.state_tile = 64;
        CHECK(qk__plan_mirror(&p) && !qk__plan_shrink(&p), "shrink: device output mirrors; slab and tile at 64: nothing left");
        p.symmetric = 0;
        CHECK(!qk__plan_mirror(&p), "shrink: K(X,Y) has no mirror");
    }
    {   /* the streaming amplitude encoder: a pure amplitude map with all states at once only */
        qk_map *amp = NULL;
        qk_plan p;
        qk_gram_desc g = gdesc(5000, 0, QK_OUTPUT_HOST);
        CHECK(qk_map_parse("amplitude", 256, &amp) == QK_OK, "parse amplitude: %s", qk_last_error());
        if (amp) {
            CHECK(qk_plan_for_device(&cards[2], 0.85, amp, &g, &p) == QK_OK && p.path == QK_PATH_REAL && p.bulk_states &&
                  qk__plan_stream_amp(&p, amp), "amplitude, 5000 samples on the H200: bulk states from the streaming encoder");
            p.bulk_states = 0; p.state_tile = 1024;
            CHECK(!qk__plan_stream_amp(&p, amp), "amplitude in state tiles: the state program, not the encoder");
            p.state_tile = 8192;
            CHECK(qk__plan_stream_amp(&p, amp), "amplitude, a state tile of every sample: the encoder");
            qk_map_free(amp);
        }
        CHECK(qk_plan_for_device(&cards[2], 0.85, zz8, &g, &p) == QK_OK && !qk__plan_stream_amp(&p, zz8), "zz: no encoder");
    }
    precision_modes(cards, zz8, zz4, zz16, hea, angle);
    auto_precision(cards, zz8, zz4, hea, angle);
    mixed_states(cards);
    qk_map_free(zz8); qk_map_free(zz4); qk_map_free(zz20); qk_map_free(zz16);
    qk_map_free(angle); qk_map_free(hea); if (zz31) qk_map_free(zz31);
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
