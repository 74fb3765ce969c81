/* Several GPUs in one process, without a GPU: qk_plan_for_devices with injected device infos
   (2, 3, 4 and 8 H200-like cards; unequal SM counts) for the cases (zz reps=2, 8
   features n = 65536 and 12 features n = 32768, K(X,X) and K(X,Y)), and small odd sizes.
   - the plan lists the ordinals it was given, its row cuts run from 0 to n_x, each device's
     pairs are what its rows say (recounted here from the geometry, not from the schedule), they
     sum to all of K's computed pairs, and the slowest device's pairs / SM count is within 5% of
     the mean (the balance target, by pair count);
   - every element of K is written by exactly one device, through its parts (qk__mgpu_parts: the
     band's diagonal block and the rectangle right of it, with its mirror; into device buffers or
     a callback, one part from the diagonal to n, the band of a job over X[a:]; K(X,Y): the
     band's rows), checked element by element on small odd sizes with QK_MGPU_MIN_PAIRS = 1;
   - a job below QK_MGPU_MIN_PAIRS per GPU stays on one GPU; qk_plan_describe names every GPU's
     rows; bad device lists are refused;
   - device states (on the first GPU): its parts planned reading them in place, the other GPU's
     as host states copied in (the raw rows' buffer counted; a small card's parts in tiles). */
#define QK_MGPU_MIN_PAIRS 1   /* small K splits too (the default keeps jobs below ~2^25 pairs per GPU on one) */
#define QK_MGPU_HOST_BOUND_SPLIT 1   /* the whole-rows split is tested (off by default) */
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../qk_test.h"

static qk_device_info card(int sms)
{
    qk_device_info d;
    memset(&d, 0, sizeof d);
    d.present = 1;
    snprintf(d.name, sizeof d.name, "NVIDIA H200");
    d.cc_major = 9;
    d.sm_count = sms;
    d.total_bytes = (size_t)141e9;
    d.free_bytes = (size_t)140e9;
    d.smem_per_block_optin = 227 * 1024;
    d.l2_bytes = 50u << 20;
    return d;
}

static qk_gram_desc gdesc(const double *x, int64_t nx, const double *y, int64_t ny, qk_output out)
{
    qk_gram_desc g;
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = nx;
    if (y) { g.y = y; g.n_y = ny; }
    g.output = out;
    g.out_path = "K.npy";
    return g;
}

/* the plan's device fields against the geometry; returns the imbalance recomputed */
static double check_split(const qk_plan *p, const qk_device_info *infos, const int *ords, int n, const char *what)
{
    int64_t total = 0, want = p->symmetric && !p->dev_full_rows ? p->n_x * (p->n_x + 1) / 2 : p->n_x * p->n_y;
    double wsum = 0, worst = 0;
    int k;
    CHECK(p->n_devices == n, "%s: %d devices planned, %d given", what, p->n_devices, n);
    CHECK(p->dev_row0[0] == 0 && p->dev_row0[p->n_devices] == p->n_x, "%s: cuts %lld .. %lld", what,
          (long long)p->dev_row0[0], (long long)p->dev_row0[p->n_devices]);
    for (k = 0; k < p->n_devices; k++) wsum += infos[k].sm_count;
    for (k = 0; k < p->n_devices; k++) {
        const int64_t a = p->dev_row0[k], b = p->dev_row0[k + 1], h = b - a;
        const int64_t pairs = p->dev_full_rows ? h * p->n_x : p->symmetric ? h * (h + 1) / 2 + h * (p->n_x - b) : h * p->n_y;
        double t;
        CHECK(p->devices[k] == (ords ? ords[k] : k), "%s: devices[%d] = %d", what, k, p->devices[k]);
        CHECK(b >= a, "%s: cut %d goes back", what, k);
        CHECK(p->dev_pairs[k] == pairs, "%s: device %d: %lld pairs, rows say %lld", what, k, (long long)p->dev_pairs[k], (long long)pairs);
        total += pairs;
        t = (double)pairs / (infos[k].sm_count / (wsum / p->n_devices));
        if (t > worst) worst = t;
    }
    CHECK(total == want, "%s: %lld pairs dealt, K has %lld", what, (long long)total, (long long)want);
    return worst / ((double)want / p->n_devices);
}

/* every element of K written once: the plan's parts (plan.parts, what the engine runs), rows x
   columns, plus the mirror of the rectangles that carry one (K(X,X) unless whole rows); a device's
   parts are its band's rows, the diagonal block first, in device order; K(X,X) into device
   buffers or a callback (no rectangle's mirror to deliver): one symmetric part a device, its rows
   from the diagonal to n (the band of a job over X[a:], which stands for its mirror too) */
static void check_cover(const qk_plan *p, const char *what)
{
    const int64_t nx = p->n_x, ny = p->n_y;
    unsigned char *c = (unsigned char *)calloc((size_t)(nx * ny), 1);
    int64_t i, j, bad = 0;
    int q, last = 0;
    if (p->n_devices == 1) {   /* one device: the plan itself, no parts */
        CHECK(p->n_parts == 0 && p->dev_row0[0] == 0 && p->dev_row0[1] == nx, "%s: one device, %d parts", what, p->n_parts);
        free(c);
        return;
    }
    const int band = p->symmetric && !p->dev_full_rows && (p->output == QK_OUTPUT_DEVICE || p->output == QK_OUTPUT_CALLBACK);
    int rows_on = 0;   /* devices with rows */
    for (q = 0; q < p->n_devices; q++) rows_on += p->dev_row0[q + 1] > p->dev_row0[q];
    CHECK(band ? p->n_parts == rows_on : p->n_parts >= rows_on && p->n_parts <= 2 * rows_on, "%s: %d parts on %d devices with rows%s", what,
          p->n_parts, rows_on, band ? " (one band each)" : "");
    for (q = 0; q < p->n_parts; q++) {
        const qk_plan_part *pp = &p->parts[q];
        const int k = pp->device;
        const int64_t a = p->dev_row0[k], b = p->dev_row0[k + 1];
        CHECK(k >= last && k < p->n_devices, "%s: part %d on device %d after device %d", what, q, k, last);
        last = k;
        CHECK(pp->row0 == a && pp->n_rows == b - a && b > a, "%s: part %d rows [%lld, +%lld), band [%lld, %lld)", what, q,
              (long long)pp->row0, (long long)pp->n_rows, (long long)a, (long long)b);
        CHECK(pp->mirror == (p->symmetric && !pp->symmetric && !p->dev_full_rows), "%s: part %d mirror %d", what, q, pp->mirror);
        CHECK(!pp->symmetric || (pp->col0 == a && pp->n_cols == (band ? nx - a : b - a) && (q == 0 || p->parts[q - 1].device != k)),
              "%s: the diagonal part of device %d: columns [%lld, +%lld) (want from %lld to %s), or not first", what, k,
              (long long)pp->col0, (long long)pp->n_cols, (long long)a, band ? "n" : "its band's end");
        CHECK(!band || pp->symmetric, "%s: part %d of device %d is not its band from the diagonal", what, q, k);
        for (i = pp->row0; i < pp->row0 + pp->n_rows && i < nx; i++)
            for (j = pp->col0; j < pp->col0 + pp->n_cols && j < ny; j++) {
                if (pp->symmetric && j < i) continue;   /* the diagonal block: its upper triangle, mirrored */
                c[i * ny + j]++;
                if (pp->mirror || (pp->symmetric && j > i)) c[j * ny + i]++;
            }
    }
    for (i = 0; i < nx * ny; i++) bad += c[i] != 1;
    CHECK(bad == 0, "%s: %lld elements of K written other than once", what, (long long)bad);
    free(c);
}

/* The plans the parts carry are the plans qk_plan_for_device makes for each part's job on its
   device (the job built here from the part's place in K, not by the library's helper): every
   field of the part, and, through the plan the engine gets (qk__plan_part_plan), the whole
   qk_plan byte for byte. */
static int n_mirror_parts;   /* parts check_part_plans saw whose GPU delivers a rectangle's transpose */
static void check_part_plans(const qk_plan *p, const qk_device_info *infos, const qk_map *map, const qk_gram_desc *g, const char *what)
{
    const int d = map->n_features;
    int q;
    for (q = 0; q < p->n_parts; q++) {
        const qk_plan_part *pp = &p->parts[q];
        qk_gram_desc sd;
        qk_plan ref, got;
        memset(&sd, 0, sizeof sd);
        sd.x = g->x + pp->row0 * d;
        sd.n_x = pp->symmetric ? pp->n_cols : pp->n_rows;   /* a symmetric part: the job over X's rows of its columns */
        if (!pp->symmetric) { sd.y = (g->y ? g->y : g->x) + pp->col0 * d; sd.n_y = pp->n_cols; }
        sd.precision = p->precision;
        sd.out_dtype = p->out_dtype;
        sd.path = g->path;
        sd.output = g->output;
        memset(&ref, 0, sizeof ref);
        if (qk_plan_for_device(&infos[pp->device], 0.85, map, &sd, &ref) != QK_OK) {
            CHECK(0, "%s: part %d: qk_plan_for_device: %s", what, q, qk_last_error());
            continue;
        }
        if (pp->mirror && (g->output == QK_OUTPUT_HOST || g->output == QK_OUTPUT_NPY)) {
            qk_test_mirror_slab(&ref);   /* its GPU delivers the rectangle's transpose too */
            n_mirror_parts++;
        }
        CHECK(pp->engine == ref.engine && pp->kernel_cfg == ref.kernel_cfg && strcmp(pp->config, ref.config) == 0,
              "%s: part %d: engine %d cfg %d '%s', qk_plan_for_device %d cfg %d '%s'", what, q, (int)pp->engine, pp->kernel_cfg,
              pp->config, (int)ref.engine, ref.kernel_cfg, ref.config);
        CHECK(pp->bulk_states == ref.bulk_states && pp->state_tile == ref.state_tile && pp->tile_m == ref.tile_m && pp->tile_n == ref.tile_n &&
              pp->slab_rows == ref.slab_rows && pp->k_resident == ref.k_resident && pp->n_streams == ref.n_streams,
              "%s: part %d: states %d/%lld tiles %lld x %lld slabs %lld resident %d; qk_plan_for_device %d/%lld %lld x %lld %lld %d", what, q,
              pp->bulk_states, (long long)pp->state_tile, (long long)pp->tile_m, (long long)pp->tile_n, (long long)pp->slab_rows, pp->k_resident,
              ref.bulk_states, (long long)ref.state_tile, (long long)ref.tile_m, (long long)ref.tile_n, (long long)ref.slab_rows, ref.k_resident);
        CHECK(pp->bytes_states == ref.bytes_states && pp->bytes_out == ref.bytes_out && pp->bytes_staging == ref.bytes_staging &&
              pp->bytes_workspace == ref.bytes_workspace && pp->bytes_total == ref.bytes_total && pp->bytes_budget == ref.bytes_budget,
              "%s: part %d: bytes differ from qk_plan_for_device's", what, q);
        CHECK(pp->bytes_budget == (size_t)(0.85 * (double)infos[pp->device].free_bytes), "%s: part %d: budget %zu of device %d's memory",
              what, q, pp->bytes_budget, pp->device);
        CHECK(ref.n_x == (pp->symmetric ? pp->n_cols : pp->n_rows) && ref.n_y == pp->n_cols && ref.symmetric == pp->symmetric && ref.path == p->path &&
              ref.precision == p->precision && ref.out_dtype == p->out_dtype, "%s: part %d: the job differs", what, q);
        qk__plan_part_plan(p, q, infos[pp->device].name, &got);
        CHECK(memcmp(&got, &ref, sizeof got) == 0, "%s: part %d: the plan the engine gets differs from qk_plan_for_device's", what, q);
    }
}

int main(void)
{
    qk_device_info infos[8], mixed[3];
    const int ords[4] = {3, 1, 0, 2};
    int n, k;
    qk_map *zz8 = NULL, *zz12 = NULL;
    static double x[70000 * 12];
    qk_plan p;
    char buf[4096];
    for (k = 0; k < 8; k++) infos[k] = card(132);
    for (k = 0; k < 70000 * 12; k++) x[k] = (double)(k % 97) * 0.01;
    if (qk_map_parse("zz(reps=2)", 8, &zz8) != QK_OK || qk_map_parse("zz(reps=2)", 12, &zz12) != QK_OK) {
        printf("map: %s\n", qk_last_error());
        return 1;
    }

    /* the cases on 2, 4, 8 GPUs */
    for (n = 2; n <= 8; n *= 2) {
        struct { const qk_map *m; int64_t nx, ny; qk_output out; const char *name; } cs[4] = {
            {NULL, 65536, 0, QK_OUTPUT_DEVICE, "zz8 K(X,X) n=65536 device"},
            {NULL, 32768, 0, QK_OUTPUT_DEVICE, "zz12 K(X,X) n=32768 device"},
            {NULL, 65536, 0, QK_OUTPUT_NPY, "zz8 K(X,X) n=65536 npy"},
            {NULL, 40000, 20001, QK_OUTPUT_HOST, "zz8 K(X,Y) 40000 x 20001 host"}};
        int c;
        cs[0].m = zz8; cs[1].m = zz12; cs[2].m = zz8; cs[3].m = zz8;
        for (c = 0; c < 4; c++) {
            qk_gram_desc g = gdesc(x, cs[c].nx, cs[c].ny ? x : NULL, cs[c].ny, cs[c].out);
            char what[128];
            double imb;
            snprintf(what, sizeof what, "%s on %d GPUs", cs[c].name, n);
            CHECK(qk_plan_for_devices(infos, NULL, n, 0.85, cs[c].m, &g, &p) == QK_OK, "%s: %s", what, qk_last_error());
            imb = check_split(&p, infos, NULL, n, what);
            CHECK(imb <= 1.05, "%s: slowest share %.4f x the mean", what, imb);
            CHECK(p.dev_imbalance <= 1.05 && p.dev_imbalance >= 1.0, "%s: plan says imbalance %.4f", what, p.dev_imbalance);
            CHECK(p.backend == QK_BACKEND_CUDA, "%s: not on the CUDA engine", what);
            /* whole rows for host-bound K(X,X) (NPY, HOST) of cheap pairs, symmetric parts on the devices */
            CHECK(p.dev_full_rows == (c == 2), "%s: dev_full_rows %d", what, p.dev_full_rows);
            check_part_plans(&p, infos, cs[c].m, &g, what);
            printf("%-44s imbalance %.4f (plan %.4f)\n", what, imb, p.dev_imbalance);
        }
    }

    /* K(X,X) to the host where the pairs cost more than the bytes (13 qubits): each GPU's
       diagonal block and the rectangle right of it, whose transpose (the mirror) that GPU delivers
       too; the planner counts the transposed slab on the device, and on a card where it does not
       fit beside a resident K, K goes out in slabs */
    {
        qk_map *zz13 = NULL;
        qk_device_info tight[2];
        int c, q, got = 0;
        CHECK(qk_map_parse("zz(reps=2)", 13, &zz13) == QK_OK, "zz13: %s", qk_last_error());
        for (c = 0; c < 3 && zz13; c++) {
            qk_gram_desc g = gdesc(x, 20000, NULL, 0, c == 1 ? QK_OUTPUT_NPY : QK_OUTPUT_HOST);
            const char *what = c == 0 ? "zz13 K(X,X) host" : c == 1 ? "zz13 K(X,X) npy" : "zz13 K(X,X) host, tight card";
            tight[0] = card(132);
            tight[1] = card(132);
            n_mirror_parts = 0;
            if (c == 2) {
                /* the rectangle's card with room for its K resident but not for the transposed slab
                   beside it: its budget set to the plan's total less half a slab, again until the
                   planner's own choices (the workspace follows the budget) settle */
                int it, settled = 0;
                for (it = 0; it < 12 && !settled; it++) {
                    CHECK(qk_plan_for_devices(tight, NULL, 2, 0.85, zz13, &g, &p) == QK_OK, "%s: %s", what, qk_last_error());
                    for (q = 0, settled = 1; q < p.n_parts; q++)
                        if (p.parts[q].mirror && p.parts[q].k_resident) {
                            const qk_plan_part *pp = &p.parts[q];
                            tight[pp->device].free_bytes = (size_t)(((double)pp->bytes_total - 0.5 * (double)pp->slab_rows * (double)pp->n_cols * 4.0) / 0.85);
                            settled = 0;
                        }
                }
            }
            CHECK(qk_plan_for_devices(tight, NULL, 2, 0.85, zz13, &g, &p) == QK_OK, "%s: %s", what, qk_last_error());
            CHECK(p.n_devices == 2 && !p.dev_full_rows && p.n_parts == 3, "%s: %d devices, full rows %d, %d parts (want 2, 0, 3)", what,
                  p.n_devices, p.dev_full_rows, p.n_parts);
            check_cover(&p, what);
            check_part_plans(&p, tight, zz13, &g, what);
            CHECK(n_mirror_parts == 1, "%s: %d parts deliver a transpose (want 1)", what, n_mirror_parts);
            qk_plan_describe(&p, buf, sizeof buf);
            CHECK(strstr(buf, ") diagonal block: ") && strstr(buf, ") rectangle + mirror: "), "%s: describe lacks the part kinds:\n%s", what, buf);
            for (q = 0; q < p.n_parts; q++)
                if (p.parts[q].mirror) {
                    const qk_plan_part *pp = &p.parts[q];
                    CHECK(pp->bytes_staging == 4 * (size_t)pp->slab_rows * (size_t)pp->n_cols * 4, "%s: staging %zu bytes", what, pp->bytes_staging);
                    CHECK(c == 2 ? !pp->k_resident : pp->k_resident, "%s: rectangle K resident %d", what, pp->k_resident);
                    if (c == 2) {   /* ... where its job alone keeps K resident: the transposed slab moved it */
                        qk_gram_desc sd;
                        qk_plan alone;
                        qk__mgpu_part_desc(&p, pp, zz13->n_features, &g, &sd);
                        CHECK(qk_plan_for_device(&tight[pp->device], 0.85, zz13, &sd, &alone) == QK_OK && alone.k_resident,
                              "%s: the rectangle's job alone is not resident either (the test does not see the transposed slab)", what);
                        got += !pp->k_resident;
                    }
                }
        }
        CHECK(got == 1, "the tight card's rectangle never left residency");
        qk_map_free(zz13);
    }

    /* ordinals as given, and the describe lines */
    {
        qk_gram_desc g = gdesc(x, 65536, NULL, 0, QK_OUTPUT_NPY);
        CHECK(qk_plan_for_devices(infos, ords, 4, 0.85, zz8, &g, &p) == QK_OK, "ordinals: %s", qk_last_error());
        check_split(&p, infos, ords, 4, "ordinals 3,1,0,2");
        qk_plan_describe(&p, buf, sizeof buf);
        for (k = 0; k < 4; k++) {
            char want[64];
            snprintf(want, sizeof want, "GPU %d: rows [%lld, %lld)", ords[k], (long long)p.dev_row0[k], (long long)p.dev_row0[k + 1]);
            CHECK(strstr(buf, want) != NULL, "describe lacks '%s':\n%s", want, buf);
        }
        CHECK(strstr(buf, "devices: 4 GPUs") != NULL, "describe lacks the device count:\n%s", buf);
        for (k = 0; k < p.n_parts; k++) {   /* and every part's plan */
            char want[160];
            const qk_plan_part *pp = &p.parts[k];
            snprintf(want, sizeof want, "[%lld, %lld) x [%lld, %lld) rows: %s, kernel_cfg %d", (long long)pp->row0, (long long)(pp->row0 + pp->n_rows),
                     (long long)pp->col0, (long long)(pp->col0 + pp->n_cols), pp->engine == QK_GPU_TC_FP32X3 ? "tc-fp32x3, fp32x3" : "?", pp->kernel_cfg);
            CHECK(strstr(buf, want) != NULL, "describe lacks '%s':\n%s", want, buf);
            snprintf(want, sizeof want, "slabs of %lld rows", (long long)pp->slab_rows);
            CHECK(strstr(buf, want) != NULL, "describe lacks '%s'", want);
            snprintf(want, sizeof want, "config: %s\n", pp->config);
            CHECK(strstr(buf, want) != NULL, "describe lacks '%s'", want);
        }
        CHECK(p.n_parts == 4, "whole rows on 4 GPUs: %d parts", p.n_parts);
        printf("%s", buf);
        /* K(X,X) on the devices: each GPU's rows from the diagonal on, one part (one call) */
        g.output = QK_OUTPUT_DEVICE;
        CHECK(qk_plan_for_devices(infos, ords, 4, 0.85, zz8, &g, &p) == QK_OK, "ordinals, device: %s", qk_last_error());
        CHECK(p.n_parts == 4, "K(X,X) on 4 GPUs, device: %d parts (4 bands from the diagonal)", p.n_parts);
        for (k = 0; k < p.n_parts; k++)
            CHECK(p.parts[k].symmetric && p.parts[k].col0 == p.dev_row0[k] && p.parts[k].n_cols == 65536 - p.dev_row0[k] &&
                  p.parts[k].n_rows == p.dev_row0[k + 1] - p.dev_row0[k], "device: part %d is not GPU %d's band from the diagonal", k, k);
        qk_plan_describe(&p, buf, sizeof buf);
        CHECK(strstr(buf, ") band from the diagonal: ") && strstr(buf, "one call"), "describe lacks the part kind:\n%s", buf);
        check_part_plans(&p, infos, zz8, &g, "ordinals, device");
    }

    /* each GPU's parts planned for that GPU: a card with less free memory gets its own plan
       (state tiles where the first card keeps every state resident); one too small for its part
       fails the plan, naming the device; the engine's check of a plan's parts */
    {
        qk_device_info small[2];
        qk_gram_desc g = gdesc(x, 40000, x, 20001, QK_OUTPUT_HOST);
        int q, bulk[2] = {-1, -1};
        qk_plan bad;
        small[0] = card(132);
        small[1] = card(132);
        small[1].free_bytes = (size_t)1e9;
        CHECK(qk_plan_for_devices(small, NULL, 2, 0.85, zz12, &g, &p) == QK_OK, "1 GB card: %s", qk_last_error());
        CHECK(p.n_devices == 2 && p.n_parts == 2, "1 GB card: %d devices, %d parts", p.n_devices, p.n_parts);
        check_part_plans(&p, small, zz12, &g, "1 GB card");
        check_cover(&p, "1 GB card");
        for (q = 0; q < p.n_parts; q++) bulk[p.parts[q].device] = p.parts[q].bulk_states;
        CHECK(bulk[0] == 1 && bulk[1] == 0 && p.bulk_states == 1, "1 GB card: states resident %d on the first, %d on the small one", bulk[0], bulk[1]);
        bad = p;
        CHECK(qk__mgpu_check_parts(&bad) == QK_OK, "the planner's parts refused: %s", qk_last_error());
        bad.n_parts = 0;
        CHECK(qk__mgpu_check_parts(&bad) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "plan.parts"), "a plan without parts accepted: %s", qk_last_error());
        bad = p;
        bad.parts[1].col0 = 1;
        CHECK(qk__mgpu_check_parts(&bad) == QK_ERROR_INVALID_ARGUMENT, "a part moved in K accepted");
        bad = p;
        bad.parts[0].device = 1;
        CHECK(qk__mgpu_check_parts(&bad) == QK_ERROR_INVALID_ARGUMENT, "a part on another device accepted");
        small[1].free_bytes = (size_t)1e5;
        CHECK(qk_plan_for_devices(small, NULL, 2, 0.85, zz12, &g, &p) == QK_ERROR_DEVICE_OUT_OF_MEMORY && strstr(qk_last_error(), "CUDA device 1: its part of K"),
              "a 100 kB card: %s", qk_last_error());
        printf("a 100 kB card: %s\n", qk_last_error());
    }

    /* unequal GPUs: shares by SM count */
    mixed[0] = card(132); mixed[1] = card(66); mixed[2] = card(114);
    {
        qk_gram_desc g = gdesc(x, 60000, NULL, 0, QK_OUTPUT_HOST);
        double imb;
        CHECK(qk_plan_for_devices(mixed, NULL, 3, 0.85, zz8, &g, &p) == QK_OK, "mixed: %s", qk_last_error());
        imb = check_split(&p, mixed, NULL, 3, "mixed 132/66/114 SMs");
        CHECK(imb <= 1.05, "mixed: slowest weighted share %.4f", imb);
        CHECK(p.dev_pairs[1] < p.dev_pairs[0] * 0.6, "mixed: the 66-SM GPU got %lld pairs vs %lld", (long long)p.dev_pairs[1], (long long)p.dev_pairs[0]);
    }

    /* small odd sizes: every element once (QK_MGPU_MIN_PAIRS = 1 here) */
    {
        const int64_t sizes[5][2] = {{1, 0}, {7, 0}, {131, 0}, {257, 0}, {99, 37}};
        int s;
        for (s = 0; s < 5; s++)
            for (n = 1; n <= 8; n++) {
                qk_gram_desc g = gdesc(x, sizes[s][0], sizes[s][1] ? x : NULL, sizes[s][1], (n & 1) ? QK_OUTPUT_CALLBACK : QK_OUTPUT_NPY);
                char what[96];
                snprintf(what, sizeof what, "n=%lld x %lld on %d GPUs", (long long)sizes[s][0], (long long)sizes[s][1], n);
                CHECK(qk_plan_for_devices(infos, NULL, n, 0.85, zz8, &g, &p) == QK_OK, "%s: %s", what, qk_last_error());
                if (p.n_devices < 1) { CHECK(0, "%s: no device", what); continue; }
                check_split(&p, infos, NULL, p.n_devices, what);
                check_cover(&p, what);
                check_part_plans(&p, infos, zz8, &g, what);
            }
    }

    /* below the threshold: one GPU (the default QK_MGPU_MIN_PAIRS, 2^25, recomputed here) */
    {
        const int64_t def = (int64_t)1 << 25;
        int64_t nsmall = 8000;   /* 32 M pairs: < 2 x 2^25 */
        int use;
        qk_gram_desc g = gdesc(x, nsmall, NULL, 0, QK_OUTPUT_HOST);
        for (use = 2; use > 1 && nsmall * (nsmall + 1) / 2 / use < def; use--) {}
        CHECK(use == 1, "threshold arithmetic");
        CHECK(qk_plan_for_devices(infos, NULL, 2, 0.85, zz8, &g, &p) == QK_OK, "small: %s", qk_last_error());
        CHECK(p.n_devices == 2, "QK_MGPU_MIN_PAIRS = 1 here: 2 devices (got %d)", p.n_devices);
        CHECK(qk_plan_for_device(&infos[0], 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 1 && p.dev_row0[1] == nsmall,
              "qk_plan_for_device: one device covering all rows (n_devices %d)", p.n_devices);
    }

    /* the tunables in the desc override the macros (1 and 1 here): mgpu_min_pairs 2^25 keeps the
       small job on one GPU, mgpu_host_bound_split -1 a host-bound K(X,X) too, 1 deals it out */
    {
        qk_gram_desc g = gdesc(x, 8000, NULL, 0, QK_OUTPUT_HOST);
        g.mgpu_min_pairs = (int64_t)1 << 25;
        CHECK(qk_plan_for_devices(infos, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 1,
              "mgpu_min_pairs 2^25: one GPU for 32 M pairs (got %d)", p.n_devices);
        g.mgpu_min_pairs = 0;
        CHECK(qk_plan_for_devices(infos, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 2 && p.dev_full_rows,
              "mgpu_host_bound_split 0 (QK_MGPU_HOST_BOUND_SPLIT 1 here): whole rows on 2 GPUs (got %d)", p.n_devices);
        g.mgpu_host_bound_split = -1;
        CHECK(qk_plan_for_devices(infos, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 1,
              "mgpu_host_bound_split -1: a host-bound K(X,X) stays on one GPU (got %d)", p.n_devices);
        g.output = QK_OUTPUT_DEVICE;
        CHECK(qk_plan_for_devices(infos, NULL, 2, 0.85, zz8, &g, &p) == QK_OK && p.n_devices == 2 && !p.dev_full_rows,
              "mgpu_host_bound_split -1 keeps K on the devices split (got %d)", p.n_devices);
    }

    /* device states (qk_gram_states, on_device = 1: they live on the first GPU) on 2 GPUs: the
       first GPU's parts are planned reading them in place (no raw rows counted), every other GPU's
       as host states copied in by tile (qk__map_for_device: QK__STATE_PEER), which counts a
       buffer of raw rows; on a 100 MB second card those parts go in state tiles. The states map is
       qk__smap_make's of host states with the device flag set (planning reads no row). */
    {
        qk_ctx *cpu = NULL;
        qk_ctx_desc cd;
        qk_states_desc st;
        qk__smap sm;
        qk_gram_desc g0 = gdesc(NULL, 0, NULL, 0, QK_OUTPUT_HOST), g;
        qk_map hm, pm;
        qk_op hop, pop;
        qk_device_info two[2];
        int c, q;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU;
        memset(&st, 0, sizeof st);
        st.dim = 4096; st.a = x; st.n_a = 3000; st.b = x; st.n_b = 2001;
        CHECK(qk_ctx_create(&cd, &cpu) == QK_OK && qk__smap_make(cpu, &st, &g0, "test", &sm, &g) == QK_OK, "states map: %s", qk_last_error());
        sm.op.q1 |= QK__STATE_DEVICE;
        hm = sm.map; hop = sm.op; hop.q1 &= ~QK__STATE_DEVICE; hm.ops = &hop;   /* the same rows as host states */
        CHECK(qk__map_for_device(&sm.map, 0, &pm, &pop) == &sm.map, "device states: the first GPU's map is not the map itself");
        CHECK(qk__map_for_device(&sm.map, 1, &pm, &pop) == &pm && pm.ops == &pop && (pop.q1 & QK__STATE_PEER) && !(pop.q1 & QK__STATE_DEVICE) &&
              pop.kind == sm.op.kind && pop.q0 == sm.op.q0 && pm.n_features == sm.map.n_features, "device states: GPU 1's map is not the peer copy");
        CHECK(qk__map_for_device(&hm, 1, &pm, &pop) == &hm && qk__map_for_device(zz8, 1, &pm, &pop) == zz8, "a map other than device states copied");
        two[0] = card(132);
        two[1] = card(132);
        for (c = 0; c < 4; c++) {
            const char *what = c == 0 ? "device states K(A,B) host" : c == 1 ? "device states K(A,A) device" : c == 2 ? "device states K(A,A) npy, 100 MB card" : "device states K(A,B) host, 100 MB card";
            int tiles1 = 0, bulk0 = 1, differ = 0;
            g.y = c == 1 || c == 2 ? NULL : g.x;
            g.n_y = g.y ? st.n_b : 0;
            g.output = c == 1 ? QK_OUTPUT_DEVICE : c == 2 ? QK_OUTPUT_NPY : QK_OUTPUT_HOST;
            g.out_path = "K.npy";
            two[1].free_bytes = c >= 2 ? (size_t)1e8 : two[0].free_bytes;
            CHECK(qk_plan_for_devices(two, NULL, 2, 0.85, &sm.map, &g, &p) == QK_OK, "%s: %s", what, qk_last_error());
            CHECK(p.n_devices == 2 && p.n_parts >= 2, "%s: %d devices, %d parts", what, p.n_devices, p.n_parts);
            check_cover(&p, what);
            for (q = 0; q < p.n_parts; q++) {
                const qk_plan_part *pp = &p.parts[q];
                qk_gram_desc sd;
                qk_plan rd, rh;
                qk__mgpu_part_desc(&p, pp, sm.map.n_features, &g, &sd);
                if (qk_plan_for_device(&two[pp->device], 0.85, &sm.map, &sd, &rd) != QK_OK ||
                    qk_plan_for_device(&two[pp->device], 0.85, &hm, &sd, &rh) != QK_OK) {
                    CHECK(0, "%s: part %d: %s", what, q, qk_last_error());
                    continue;
                }
                {   /* the first GPU: in place (the device map's plan); the second: the host states' plan */
                    const qk_plan *want = pp->device == 0 ? &rd : &rh;
                    CHECK(pp->bulk_states == want->bulk_states && pp->state_tile == want->state_tile && pp->tile_m == want->tile_m &&
                          pp->bytes_states == want->bytes_states && pp->bytes_total == want->bytes_total && pp->engine == want->engine,
                          "%s: part %d on GPU %d: states %d/%lld, %zu bytes; want %s's %d/%lld, %zu bytes", what, q, pp->device, pp->bulk_states,
                          (long long)pp->state_tile, pp->bytes_states, pp->device == 0 ? "in place" : "copied in", want->bulk_states,
                          (long long)want->state_tile, want->bytes_states);
                }
                if (pp->device == 1) {
                    differ += rd.bytes_states != rh.bytes_states;
                    tiles1 += !pp->bulk_states;
                } else bulk0 &= pp->bulk_states;
            }
            CHECK(differ > 0, "%s: the raw rows change no part's bytes on GPU 1 (the test would not see them)", what);
            CHECK(bulk0 && (c >= 2 ? tiles1 > 0 : tiles1 == 0), "%s: states resident on GPU 0 %d, GPU 1's parts in tiles %d", what, bulk0, tiles1);
            printf("%-44s %d parts, GPU 1 in tiles: %d\n", what, p.n_parts, tiles1);
        }
        qk__smap_free(&sm);
        qk_ctx_destroy(cpu);
    }

    /* bad lists */
    {
        qk_gram_desc g = gdesc(x, 1000, NULL, 0, QK_OUTPUT_HOST);
        const int dup[2] = {1, 1}, neg[2] = {0, -1};
        qk_device_info absent[2];
        absent[0] = card(132);
        memset(&absent[1], 0, sizeof absent[1]);
        CHECK(qk_plan_for_devices(infos, NULL, 0, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "n = 0 accepted");
        CHECK(qk_plan_for_devices(infos, NULL, QK_MAX_DEVICES + 1, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "n too large accepted");
        CHECK(qk_plan_for_devices(infos, dup, 2, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "twice"),
              "duplicate ordinal: %s", qk_last_error());
        CHECK(qk_plan_for_devices(infos, neg, 2, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "negative ordinal accepted");
        CHECK(qk_plan_for_devices(absent, NULL, 2, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "absent device accepted");
        CHECK(qk_plan_for_devices(NULL, NULL, 2, 0.85, zz8, &g, &p) == QK_ERROR_INVALID_ARGUMENT, "NULL infos accepted");
    }

    /* a context's device list is checked before any device is looked at */
    {
        qk_ctx_desc cd;
        qk_ctx *ctx = NULL;
        const int dup[2] = {0, 0}, neg[1] = {-2};
        memset(&cd, 0, sizeof cd);
        cd.cuda_devices = dup; cd.n_cuda_devices = 2;
        CHECK(qk_ctx_create(&cd, &ctx) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "twice"), "ctx: duplicate accepted: %s", qk_last_error());
        cd.cuda_devices = neg; cd.n_cuda_devices = 1;
        CHECK(qk_ctx_create(&cd, &ctx) == QK_ERROR_INVALID_ARGUMENT, "ctx: negative ordinal accepted");
        cd.cuda_devices = NULL; cd.n_cuda_devices = QK_MAX_DEVICES + 1;
        CHECK(qk_ctx_create(&cd, &ctx) == QK_ERROR_INVALID_ARGUMENT, "ctx: too many devices accepted");
        cd.device = QK_DEVICE_CPU; cd.n_cuda_devices = 2;   /* CPU: the list is not used */
        CHECK(qk_ctx_create(&cd, &ctx) == QK_OK, "ctx: CPU with a list: %s", qk_last_error());
        CHECK(ctx && qk_ctx_query(ctx).n_cuda_devices == 0, "ctx: a CPU context reports GPUs");
        CHECK(qk_ctx_device_seconds(ctx, NULL, 0) == 0, "ctx: device seconds before any GPU job");
        qk_ctx_destroy(ctx);
    }

    qk_map_free(zz8);
    qk_map_free(zz12);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
