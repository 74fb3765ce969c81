/* qk_schedule_make, the static split of K over workers (MPI ranks x GPUs); no MPI, no GPU.
   - bad arguments are refused with a detail;
   - small K(X,X) and K(X,Y), many worker counts, alignments and weights: every pair of K (the
     upper triangle i <= j for K(X,X)) is in exactly one item, items are rows bands of their
     worker (the diagonal block symmetric, the rectangle right of it), cuts are aligned, pair
     counts are what the geometry says (counted here entry by entry, not from the formula);
   - balance on realistic sizes: K(X,X) and K(X,Y) of n = 20 000 .. 1 000 000 on 2 .. 64 workers
     (ranks x GPUs: 8 nodes x 8 GPUs for n = 10^6), and workers of unequal speed from injected
     device infos (weights = SM counts): the slowest worker's pairs / weight is within 5% of the
     mean (imbalance <= 1.05), recomputed here from the items. */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../qk_test.h"

static void bad_args(void) {
    qk_schedule s;
    qk_schedule_desc d;
    double w[3] = {1.0, 0.0, 1.0};
    memset(&d, 0, sizeof d);
    d.n_x = 100; d.n_workers = 3;
    CHECK(qk_schedule_make(&d, NULL) == QK_ERROR_INVALID_ARGUMENT, "NULL out accepted");
    CHECK(qk_schedule_make(NULL, &s) == QK_ERROR_INVALID_ARGUMENT, "NULL desc accepted");
    d.n_x = 0;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "n_x"), "n_x = 0: %s", qk_last_error());
    d.n_x = 100; d.n_workers = 0;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "n_workers"), "0 workers: %s", qk_last_error());
    d.n_workers = 3; d.n_y = -1;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT, "n_y < 0 accepted");
    d.n_y = 0; d.align = -4;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT, "align < 0 accepted");
    d.align = 0; d.weights = w;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT && strstr(qk_last_error(), "weights[1]"), "weight 0: %s", qk_last_error());
    w[1] = NAN;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT, "NaN weight accepted");
    w[1] = -2;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT, "negative weight accepted");
    d.weights = NULL; d.n_x = (int64_t)1 << 40;
    CHECK(qk_schedule_make(&d, &s) == QK_ERROR_INVALID_ARGUMENT, "a K of 2^80 pairs accepted");
    qk_schedule_free(NULL);
}

/* Checks the geometry of one schedule by marking every pair it deals. */
static void check_cover(int64_t n, int64_t ny, int W, const double *weights, int64_t align) {
    qk_schedule s;
    qk_schedule_desc d;
    int64_t cols = ny ? ny : n, i, j, total = 0;
    unsigned char *mark = (unsigned char *)calloc((size_t)(n * cols), 1);
    int w, k, bad_geom = 0;
    memset(&d, 0, sizeof d);
    d.n_x = n; d.n_y = ny; d.n_workers = W; d.weights = weights; d.align = align;
    if (qk_schedule_make(&d, &s) != QK_OK) { CHECK(0, "n %lld ny %lld W %d: %s", (long long)n, (long long)ny, W, qk_last_error()); free(mark); return; }
    CHECK(s.row0[0] == 0 && s.row0[W] == n, "cuts do not span [0, n)");
    CHECK(s.first[0] == 0 && s.first[W] == s.n_items, "first[] does not span the items");
    for (w = 0; w < W; w++) {
        int64_t pairs = 0;
        CHECK(s.row0[w] <= s.row0[w + 1], "cuts not monotone at %d", w);
        CHECK(w == 0 || s.row0[w] == n || s.row0[w] % s.align == 0, "cut %lld not a multiple of align %lld", (long long)s.row0[w], (long long)s.align);
        for (k = s.first[w]; k < s.first[w + 1]; k++) {
            const qk_work_item *it = &s.items[k];
            int64_t counted = 0;
            if (it->worker != w || it->i0 != s.row0[w] || it->i1 != s.row0[w + 1] || it->i1 <= it->i0) bad_geom++;
            if (it->symmetric && (ny || it->j0 != it->i0 || it->j1 != it->i1)) bad_geom++;
            if (!it->symmetric && (ny ? (it->j0 != 0 || it->j1 != ny) : (it->j0 != it->i1 || it->j1 != n))) bad_geom++;
            for (i = it->i0; i < it->i1; i++)
                for (j = it->j0; j < it->j1; j++) {
                    if (it->symmetric && j < i) continue;
                    mark[i * cols + j]++;
                    counted++;
                }
            CHECK(counted == it->pairs, "item %d: %lld pairs counted, %lld stated", k, (long long)counted, (long long)it->pairs);
            pairs += counted;
        }
        CHECK(pairs == s.pairs[w], "worker %d: %lld pairs counted, %lld stated", w, (long long)pairs, (long long)s.pairs[w]);
        CHECK((s.row0[w] == s.row0[w + 1]) == (s.first[w] == s.first[w + 1]), "worker %d: items and rows disagree", w);
        total += pairs;
    }
    CHECK(bad_geom == 0, "n %lld ny %lld W %d: %d items with a wrong shape", (long long)n, (long long)ny, W, bad_geom);
    CHECK(total == s.pairs_total, "pairs %lld, total stated %lld", (long long)total, (long long)s.pairs_total);
    {
        int64_t wrong = 0;
        for (i = 0; i < n; i++)
            for (j = 0; j < cols; j++)
                if (mark[i * cols + j] != ((ny || j >= i) ? 1 : 0)) wrong++;
        CHECK(wrong == 0, "n %lld ny %lld W %d align %lld: %lld entries not dealt exactly once", (long long)n, (long long)ny, W,
              (long long)align, (long long)wrong);
    }
    qk_schedule_free(&s);
    CHECK(s.items == NULL && s.n_items == 0, "qk_schedule_free leaves the schedule set");
    free(mark);
}

/* The imbalance recomputed from the items (not the schedule's own figure); returns it. */
static double balance(int64_t n, int64_t ny, int W, const double *weights, int64_t align) {
    qk_schedule s;
    qk_schedule_desc d;
    double wsum = 0, worst = 0, total = 0;
    int w, k;
    memset(&d, 0, sizeof d);
    d.n_x = n; d.n_y = ny; d.n_workers = W; d.weights = weights; d.align = align;
    if (qk_schedule_make(&d, &s) != QK_OK) { CHECK(0, "%s", qk_last_error()); return 1e9; }
    for (w = 0; w < W; w++) wsum += weights ? weights[w] : 1.0;
    for (w = 0; w < W; w++) {
        double p = 0, omega = (weights ? weights[w] : 1.0) * W / wsum;
        for (k = s.first[w]; k < s.first[w + 1]; k++) p += (double)s.items[k].pairs;
        total += p;
        if (p / omega > worst) worst = p / omega;
    }
    CHECK(fabs(worst / (total / W) - s.imbalance) < 1e-9, "stated imbalance %.6f, recomputed %.6f", s.imbalance, worst / (total / W));
    qk_schedule_free(&s);
    return worst / (total / W);
}

int main(void) {
    static const int64_t small_n[] = {1, 2, 7, 37, 64, 65, 131, 200};
    static const int workers[] = {1, 2, 3, 4, 7, 16};
    static const int64_t aligns[] = {0, 1, 16, 64};
    double w3[3] = {1.0, 2.5, 0.7};
    size_t a, b, c;
    int W;

    bad_args();

    for (a = 0; a < sizeof small_n / sizeof small_n[0]; a++)
        for (b = 0; b < sizeof workers / sizeof workers[0]; b++)
            for (c = 0; c < sizeof aligns / sizeof aligns[0]; c++) {
                check_cover(small_n[a], 0, workers[b], NULL, aligns[c]);
                check_cover(small_n[a], 53, workers[b], NULL, aligns[c]);
            }
    check_cover(131, 0, 3, w3, 0);
    check_cover(131, 17, 3, w3, 1);

    /* realistic sizes, equal workers (auto alignment) */
    {
        static const int64_t ns[] = {20000, 32768, 65536, 200000};
        static const int ws[] = {2, 3, 4, 8, 16};
        for (a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (b = 0; b < sizeof ws / sizeof ws[0]; b++) {
                double im = balance(ns[a], 0, ws[b], NULL, 0), imy = balance(ns[a], ns[a] / 3 + 1, ws[b], NULL, 0);
                CHECK(im <= 1.05, "K(X,X) n %lld on %d workers: imbalance %.4f", (long long)ns[a], ws[b], im);
                CHECK(imy <= 1.05, "K(X,Y) n %lld on %d workers: imbalance %.4f", (long long)ns[a], ws[b], imy);
            }
        /* the plan of docs/scale.md: 10^6 samples, 8 nodes x 8 GPUs; and 2 ranks x 2 GPUs */
        CHECK(balance(1000000, 0, 64, NULL, 0) <= 1.05, "n 1e6 on 64 workers: %.4f", balance(1000000, 0, 64, NULL, 0));
        CHECK(balance(1000000, 0, 64, NULL, 64) <= 1.05, "n 1e6 on 64 workers, align 64: %.4f", balance(1000000, 0, 64, NULL, 64));
        CHECK(balance(65536, 0, 4, NULL, 256) <= 1.05, "n 65536 on 4 workers, align 256: %.4f", balance(65536, 0, 4, NULL, 256));
    }

    /* workers of unequal speed: injected device infos, weights = SM counts */
    {
        qk_device_info dev[4];
        double wt[8];
        int k;
        memset(dev, 0, sizeof dev);
        snprintf(dev[0].name, sizeof dev[0].name, "NVIDIA H200"); dev[0].sm_count = 132; dev[0].present = 1;
        snprintf(dev[1].name, sizeof dev[1].name, "NVIDIA A100-SXM4-80GB"); dev[1].sm_count = 108; dev[1].present = 1;
        snprintf(dev[2].name, sizeof dev[2].name, "NVIDIA L4"); dev[2].sm_count = 58; dev[2].present = 1;
        snprintf(dev[3].name, sizeof dev[3].name, "NVIDIA H100 PCIe"); dev[3].sm_count = 114; dev[3].present = 1;
        for (k = 0; k < 8; k++) wt[k] = (double)dev[k % 4].sm_count;   /* 2 ranks x 4 GPUs */
        for (W = 2; W <= 8; W++) {
            double im = balance(65536, 0, W, wt, 0), imy = balance(32768, 50000, W, wt, 0);
            CHECK(im <= 1.05, "K(X,X) on %d mixed GPUs: imbalance %.4f", W, im);
            CHECK(imy <= 1.05, "K(X,Y) on %d mixed GPUs: imbalance %.4f", W, imy);
            check_cover(301, 0, W, wt, 0);
        }
        {   /* the faster device gets more pairs, in proportion */
            qk_schedule s;
            qk_schedule_desc d;
            memset(&d, 0, sizeof d);
            d.n_x = 65536; d.n_workers = 3; d.weights = wt + 1;   /* A100, L4, H100 */
            if (qk_schedule_make(&d, &s) == QK_OK) {
                double r = ((double)s.pairs[0] / 108.0) / ((double)s.pairs[1] / 58.0);
                CHECK(fabs(r - 1.0) < 0.05, "A100 vs L4 pairs per SM differ by %.3f", r);
                CHECK(s.pairs[2] > s.pairs[0] && s.pairs[0] > s.pairs[1], "pairs not ordered by SM count");
                qk_schedule_free(&s);
            } else CHECK(0, "%s", qk_last_error());
        }
    }

    /* tiny K: balance is not promised, but the schedule stays valid (checked above) and the
       auto alignment goes down to 1 row */
    {
        qk_schedule s;
        qk_schedule_desc d;
        memset(&d, 0, sizeof d);
        d.n_x = 37; d.n_workers = 3;
        CHECK(qk_schedule_make(&d, &s) == QK_OK && s.align == 1 && s.pairs[0] > 0 && s.pairs[1] > 0 && s.pairs[2] > 0,
              "n 37 on 3 workers: align %lld, pairs %lld %lld %lld", (long long)s.align, (long long)s.pairs[0], (long long)s.pairs[1], (long long)s.pairs[2]);
        qk_schedule_free(&s);
        d.n_x = 1000000; d.n_workers = 8;
        CHECK(qk_schedule_make(&d, &s) == QK_OK && s.align == 64, "n 1e6 on 8 workers: align %lld, not 64", (long long)s.align);
        qk_schedule_free(&s);
    }

    printf("test_mpi_schedule: %s (%d failures)\n", qk_test_fails ? "FAILED" : "ok", qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
