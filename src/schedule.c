#include "qk_internal.h"
/* >>schedule_impl ---- the work schedule (K dealt to MPI ranks x GPUs) ---- */
/* The schedule (declared with qk_schedule_desc): P(r), the pairs of rows [0, r), is r n_y for
   K(X,Y) and r n - r (r - 1) / 2 for the upper triangle of K(X,X) (row i has n - i pairs); cut k
   is the aligned row whose P is closest to the weighted share of workers 0 .. k-1. */
static int64_t qk__sched_pairs_before(int64_t r, int64_t n, int64_t n_y)
{
    return n_y > 0 ? r * n_y : r * n - r * (r - 1) / 2;
}

QKDEF void qk_schedule_free(qk_schedule *s)
{
    if (!s) return;
    QK_FREE(s->items);   /* the one allocation holding every array */
    memset(s, 0, sizeof *s);
}

QKDEF qk_result qk_schedule_make(const qk_schedule_desc *desc, qk_schedule *out)
{
    qk_schedule s;
    int64_t n, ny, align, total;
    int W, w, k;
    double wsum = 0.0, acc = 0.0, worst = 0.0;
    size_t bytes;
    char *mem;
    if (!out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: out is NULL");
    memset(out, 0, sizeof *out);
    if (!desc) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: desc is NULL");
    n = desc->n_x;
    ny = desc->n_y;
    W = desc->n_workers;
    if (n <= 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_x must be > 0 (got %lld)", (long long)n);
    if (ny < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_y must be >= 0 (got %lld)", (long long)ny);
    if (W <= 0 || W > (1 << 24)) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: n_workers must be in [1, 2^24] (got %d)", W);
    if (desc->align < 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: align must be >= 0 (got %lld)", (long long)desc->align);
    if (ny > 0 ? n > INT64_MAX / 4 / ny : n > ((int64_t)1 << 31))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: K of %lld x %lld is too large", (long long)n, (long long)(ny ? ny : n));
    for (w = 0; w < W; w++) {
        double v = desc->weights ? desc->weights[w] : 1.0;
        if (!(v > 0.0) || !isfinite(v))
            return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_schedule_make: weights[%d] = %g (weights must be finite and > 0)", w, v);
        wsum += v;
    }
    align = desc->align;
    if (align == 0)
        for (align = 64; align > 1 && n < 64 * align * (int64_t)W; align /= 2) {}
    total = qk__sched_pairs_before(n, n, ny);

    memset(&s, 0, sizeof s);
    bytes = sizeof(qk_work_item) * 2 * (size_t)W + sizeof(int64_t) * (2 * (size_t)W + 1) + sizeof(int) * ((size_t)W + 1);
    mem = (char *)qk__malloc(bytes);
    if (!mem) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "qk_schedule_make: out of memory (%d workers)", W);
    s.items = (qk_work_item *)(void *)mem;
    s.row0 = (int64_t *)(void *)(mem + sizeof(qk_work_item) * 2 * (size_t)W);
    s.pairs = s.row0 + W + 1;
    s.first = (int *)(void *)(s.pairs + W);
    s.n_workers = W;
    s.align = align;
    s.pairs_total = total;

    s.row0[0] = 0;
    s.row0[W] = n;
    for (k = 1; k < W; k++) {
        double T, r, disc;
        int64_t lo, c[3], best;
        int i;
        acc += desc->weights ? desc->weights[k - 1] : 1.0;
        T = (double)total * (acc / wsum);
        if (ny > 0) r = T / (double)ny;
        else {
            disc = (2.0 * (double)n + 1.0) * (2.0 * (double)n + 1.0) - 8.0 * T;
            r = ((2.0 * (double)n + 1.0) - sqrt(disc > 0.0 ? disc : 0.0)) / 2.0;
        }
        if (r < 0.0) r = 0.0;
        if (r > (double)n) r = (double)n;
        lo = (int64_t)(r / (double)align) * align;
        c[0] = lo - align; c[1] = lo; c[2] = lo + align;
        best = -1;
        for (i = 0; i < 3; i++) {
            int64_t v = c[i] < s.row0[k - 1] ? s.row0[k - 1] : c[i] > n ? n : c[i];
            if (best < 0 || fabs((double)qk__sched_pairs_before(v, n, ny) - T) < fabs((double)qk__sched_pairs_before(best, n, ny) - T))
                best = v;
        }
        s.row0[k] = best;
        QK_ASSERT(s.row0[k] >= s.row0[k - 1] && s.row0[k] <= n); /* bands ascend inside [0, n] */
    }

    for (w = 0; w < W; w++) {
        int64_t a = s.row0[w], b = s.row0[w + 1], h = b - a;
        double omega = (desc->weights ? desc->weights[w] : 1.0) / (wsum / (double)W), t;
        s.first[w] = s.n_items;
        s.pairs[w] = 0;
        if (h > 0) {
            qk_work_item *it = &s.items[s.n_items++];
            it->worker = w;
            it->i0 = a; it->i1 = b;
            if (ny > 0) { it->j0 = 0; it->j1 = ny; it->symmetric = 0; it->pairs = h * ny; }
            else { it->j0 = a; it->j1 = b; it->symmetric = 1; it->pairs = h * (h + 1) / 2; }
            s.pairs[w] += it->pairs;
            if (ny == 0 && b < n) {
                it = &s.items[s.n_items++];
                it->worker = w;
                it->i0 = a; it->i1 = b; it->j0 = b; it->j1 = n; it->symmetric = 0;
                it->pairs = h * (n - b);
                s.pairs[w] += it->pairs;
            }
        }
        t = (double)s.pairs[w] / omega;
        if (t > worst) worst = t;
    }
    s.first[W] = s.n_items;
    QK_ASSERT(s.n_items <= 2 * W); /* the items array holds two per worker */
    s.imbalance = worst / ((double)total / (double)W);
    *out = s;
    return QK_OK;
}

/* ---- end work schedule ---- */
