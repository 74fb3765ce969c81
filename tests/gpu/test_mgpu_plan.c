/* Several GPUs in one process, without a GPU: qk_plan_for_devices with injected device infos
   (2, 3, 4 and 8 H200-like cards; unequal SM counts) for the cases (zz reps=2, 8
   features n = 65536 and 12 features n = 32768, K(X,X) and K(X,Y)), and small odd sizes.
   - the plan lists the ordinals it was given, its row cuts run from 0 to n_x, each device's
     pairs are what its rows say (recounted here from the geometry, not from the schedule), they
     sum to all of K's computed pairs, and the slowest device's pairs / SM count is within 5% of
     the mean (the balance target, by pair count);
   - every element of K is written by exactly one device, through its parts (qk__mgpu_parts: the
     band's diagonal block and the rectangle right of it, with its mirror; K(X,Y): the band's
     rows), checked element by element on small odd sizes with QK_MGPU_MIN_PAIRS = 1;
   - a job below QK_MGPU_MIN_PAIRS per GPU stays on one GPU; qk_plan_describe names every GPU's
     rows; bad device lists are refused. */
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

/* every element of K written once: the parts' rows x columns, plus the mirror of symmetric
   rectangles */
static void check_cover(const qk_plan *p, const char *what)
{
    const int64_t nx = p->n_x, ny = p->n_y;
    unsigned char *c = (unsigned char *)calloc((size_t)(nx * ny), 1);
    int64_t i, j, bad = 0;
    int k, q;
    for (k = 0; k < p->n_devices; k++) {
        int64_t part[2][3];
        int np = qk__mgpu_parts(p, k, part);
        const int64_t a = p->dev_row0[k], b = p->dev_row0[k + 1];
        for (q = 0; q < np; q++) {
            const int diag = (int)part[q][2];
            for (i = a; i < b; i++)
                for (j = part[q][0]; j < part[q][1]; j++) {
                    c[i * ny + j]++;
                    if (p->symmetric && !diag && !p->dev_full_rows) c[j * ny + i]++;   /* the mirror */
                }
            CHECK(!diag || (part[q][0] == a && part[q][1] == b), "%s: the diagonal part of device %d is not square", what, k);
        }
    }
    for (i = 0; i < nx * ny; i++) bad += c[i] != 1;
    CHECK(bad == 0, "%s: %lld elements of K written other than once", what, (long long)bad);
    free(c);
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
            printf("%-44s imbalance %.4f (plan %.4f)\n", what, imb, p.dev_imbalance);
        }
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
        printf("%s", buf);
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
