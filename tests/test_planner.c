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
        CHECK(qk_plan_for_device(d, 0.85, zz20, &g, &p) == QK_OK, "%s zz20: %s", d->name, qk_last_error());
        invariants(&p, d, 0.85, "zz20 callback");
        CHECK(!p.bulk_states && !p.k_resident, "%s zz20: bulk %d resident %d", d->name, p.bulk_states, p.k_resident);
        CHECK((double)p.state_tile * 2 * 8.0 * (1 << 20) <= 0.5 * 0.85 * d->free_bytes, "%s zz20: tile %lld too big", d->name, (long long)p.state_tile);
        /* a smaller fraction never plans more */
        g = gdesc(200000, 0, QK_OUTPUT_CALLBACK);
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
            /* beyond the statevector: a local map takes the MPS path (CPU engine, docs/mps.md);
               the statevector, forced, must fail */
            CHECK(qk_plan_for_device(d, 0.85, zz31, &g, &p) == QK_OK && p.backend == QK_BACKEND_CPU && p.path == QK_PATH_MPS,
                  "%s: 31 qubits zz linear: MPS on the CPU (%s)", d->name, qk_last_error());
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
        CHECK(qk_map_parse("zz(reps=1,ent=linear)", 30, &z30) == QK_OK, "parse zz30");
        CHECK(qk_plan_for_device(&cards[0], 0.85, z30, &g, &p) == QK_ERROR_DEVICE_OUT_OF_MEMORY, "24 GB, 30 qubits: must not fit");
        CHECK(qk_plan_for_device(&cards[2], 0.85, z30, &g, &p) == QK_OK && !p.bulk_states && p.state_tile >= 1 && p.state_tile <= 2, "141 GB, 30 qubits: one or two states per tile");
        qk_map_free(z30);
    }
    qk_map_free(zz8); qk_map_free(zz4); qk_map_free(zz20); qk_map_free(zz16);
    qk_map_free(angle); qk_map_free(hea); if (zz31) qk_map_free(zz31);
    printf("%d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
