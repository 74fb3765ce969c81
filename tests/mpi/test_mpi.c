/* qk_gram_mpi under mpirun -n 1, 2, 3 (tests/mpi/test_mpi.py runs it; CPU engine):
   - K(X,X) and K(X,Y) of odd sizes, complex / real / product maps, float64 and float32, to one
     .npy file with MPI-IO: the file is byte for byte the .npy that one qk_gram writes;
   - the tile callback: every entry of K (the upper triangle for K(X,X)) comes exactly once,
     over all ranks, bitwise equal to one qk_gram's K;
   - progress: each rank's count ends at its total, and the totals add up to n_x * n_y;
   - failures on one rank (each rank in turn): a progress callback that cancels, a tile callback
     that cancels, NaN in that rank's X, X that differs on that rank; and a missing output
     directory and an unsupported output mode on all: every rank returns the error, the detail
     names the failing rank, the output directory holds no new file (no temporary file either)
     and an old file at out_path is left as it was;
   - given states (qk_gram_mpi_states): complex and real statevectors, density matrices, padded
     rows (padding that differs by rank), normalize: the .npy byte for byte qk_gram_states' in one
     process, the tiles bitwise its K; a NaN or a norm off 1 (on every rank, or on one), states
     that differ on one rank: every rank returns the same error naming the row, and no file is
     left;
   - a state provider on each rank (qk_gram_mpi_states): the same .npy and tiles; each rank asked
     only for its blocks' rows, and (1 MB blocks) each row as often as its blocks need; a provider
     that fails, gives a NaN, gives a row unlike the other ranks' or unlike its own first answer,
     on each rank in turn: every rank returns the same error naming the rank and the rows, no
     file is left.
   QK_MPI_BLOCK_BYTES is tiny here, so that each rank's band takes many blocks (22 x 23 or 32 x 32);
   the desc's mpi_block_bytes overrides it (fewer tiles, the same K).
   Usage: mpirun -n R test_mpi DIR [single|serialized|multiple] (DIR: an empty scratch directory
   every rank sees; the MPI thread level to ask for, default single). */
#define _POSIX_C_SOURCE 200809L
#include "qk.h"   /* a plain include first: QK_MPI may come with a later one */
#define QK_MPI
#define QK_MPI_BLOCK_BYTES 4096
#define QK_MPI_SYNC_BYTES 8192   /* the writer thread's periodic sync runs too */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int rank_, size_;
static const char *rank_prefix(void) {
    static char p[32];
    snprintf(p, sizeof p, "rank %d: ", rank_);
    return p;
}
#define QK_TEST_PREFIX() rank_prefix()
#include "../qk_test.h"

static char dir_[1024];

static double *samples(int64_t n, int d, uint64_t seed) {
    double *x = (double *)malloc(sizeof(double) * (size_t)(n * d));
    int64_t i;
    qk_test_seed_set(seed);
    for (i = 0; i < n * d; i++) x[i] = qk_test_urand() * 3.14159;
    return x;
}

/* Names in d other than `keep1`, `keep2` (NULL: none): a count, and the first one. */
static int stray_files(const char *d, const char *keep1, const char *keep2, char *first, size_t size) {
    DIR *dp = opendir(d);
    struct dirent *e;
    int n = 0;
    first[0] = 0;
    if (!dp) return -1;
    while ((e = readdir(dp)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if ((keep1 && !strcmp(e->d_name, keep1)) || (keep2 && !strcmp(e->d_name, keep2))) continue;
        if (!n) snprintf(first, size, "%s", e->d_name);
        n++;
    }
    closedir(dp);
    return n;
}

/* 1 on every rank when every rank passes 1 */
static int all_ranks(int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* ---- tile collection (callback output) ---- */
typedef struct tiles {
    int64_t n, cols;
    int symmetric;
    qk_dtype dt;
    double *val;        /* n x cols */
    int *count;         /* deliveries of each entry (upper triangle for symmetric K) */
    int bad_lower;      /* a lower-triangle entry of a diagonal tile that is not its mirror */
    int bad_tile;       /* a tile outside K, or j0 < i0 for symmetric K */
    int cancel_after;   /* > 0: return 1 (cancel) at that call */
    int calls;
} tiles;

static int collect(int64_t i0, int64_t j0, int64_t m, int64_t n, const void *t, int64_t ld, void *user) {
    tiles *c = (tiles *)user;
    int64_t a, b;
    c->calls++;
    if (c->cancel_after > 0 && c->calls >= c->cancel_after) return 1;
    if (i0 < 0 || j0 < 0 || i0 + m > c->n || j0 + n > c->cols || m <= 0 || n <= 0 || (c->symmetric && j0 < i0)) {
        c->bad_tile++;
        return 0;
    }
    for (a = 0; a < m; a++)
        for (b = 0; b < n; b++) {
            int64_t i = i0 + a, j = j0 + b;
            double v = c->dt == QK_F32 ? (double)((const float *)t)[a * ld + b] : ((const double *)t)[a * ld + b];
            if (c->symmetric && j < i) continue;   /* checked against its mirror below */
            c->val[i * c->cols + j] = v;
            c->count[i * c->cols + j]++;
        }
    if (c->symmetric) /* diagonal tiles come whole: their lower part must be the mirror */
        for (a = 0; a < m; a++)
            for (b = 0; b < n; b++) {
                int64_t i = i0 + a, j = j0 + b;
                double v = c->dt == QK_F32 ? (double)((const float *)t)[a * ld + b] : ((const double *)t)[a * ld + b];
                if (j < i && i - j0 < n && j - i0 >= 0 && j - i0 < m) {
                    double u = c->dt == QK_F32 ? (double)((const float *)t)[(j - i0) * ld + (i - j0)] : ((const double *)t)[(j - i0) * ld + (i - j0)];
                    if (memcmp(&u, &v, sizeof u) != 0) c->bad_lower++;
                }
            }
    return 0;
}

typedef struct prog { int64_t last, total; int calls, cancel_after, monotone_bad; } prog;
static int on_progress(int64_t done, int64_t total, void *user) {
    prog *p = (prog *)user;
    p->calls++;
    if (done < p->last || (p->total && total != p->total)) p->monotone_bad++;
    p->last = done;
    p->total = total;
    return p->cancel_after > 0 && p->calls >= p->cancel_after;
}

/* ---- the K checks ---- */
typedef struct gcase { const char *spec; int d; int64_t nx, ny; qk_dtype dt; } gcase;

static void check_case(const gcase *gc, int idx) {
    qk_ctx *ctx = qk_test_cpu_ctx(1);   /* one thread: R ranks share the 2 cores of CI */
    qk_map *map = NULL;
    double *x = samples(gc->nx, gc->d, 100 + (uint64_t)idx), *y = gc->ny ? samples(gc->ny, gc->d, 200 + (uint64_t)idx) : NULL;
    int64_t cols = gc->ny ? gc->ny : gc->nx, i, j;
    size_t es = gc->dt == QK_F32 ? 4 : 8;
    char ref_path[1200], out_path[1200], sub[1100], stray[256];
    void *kref = malloc(es * (size_t)(gc->nx * cols));
    qk_gram_desc g;
    qk_result r;
    tiles tc;
    prog pg;
    int64_t totals = 0;

    snprintf(sub, sizeof sub, "%s/case%d", dir_, idx);
    if (rank_ == 0) mkdir(sub, 0777);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(ref_path, sizeof ref_path, "%s/ref.npy", sub);
    snprintf(out_path, sizeof out_path, "%s/K.npy", sub);
    if (qk_map_parse(gc->spec, gc->d, &map) != QK_OK) { CHECK(0, "map %s: %s", gc->spec, qk_last_error()); return; }

    /* the single-process K: a host buffer on every rank, the .npy file on rank 0 */
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = gc->nx; g.y = y; g.n_y = gc->ny; g.out_dtype = gc->dt; g.out = kref;
    r = qk_gram(ctx, map, &g);
    CHECK(r == QK_OK, "case %d: qk_gram: %s", idx, qk_last_error());
    if (rank_ == 0) {
        g.output = QK_OUTPUT_NPY; g.out = NULL; g.out_path = ref_path;
        r = qk_gram(ctx, map, &g);
        CHECK(r == QK_OK, "case %d: qk_gram npy: %s", idx, qk_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* MPI-IO .npy: byte for byte the single-process file */
    memset(&g, 0, sizeof g);
    memset(&pg, 0, sizeof pg);
    g.x = x; g.n_x = gc->nx; g.y = y; g.n_y = gc->ny; g.out_dtype = gc->dt;
    g.output = QK_OUTPUT_NPY; g.out_path = out_path; g.no_sync = idx & 1;
    g.progress = on_progress; g.progress_user = &pg;
    r = qk_gram_mpi(ctx, map, &g, MPI_COMM_WORLD);
    CHECK(r == QK_OK, "case %d (%s, %lld x %lld): qk_gram_mpi npy: %s", idx, gc->spec, (long long)gc->nx, (long long)cols, qk_last_error());
    CHECK(pg.monotone_bad == 0 && pg.last == pg.total, "case %d: progress ended at %lld of %lld (%d bad calls)", idx, (long long)pg.last, (long long)pg.total, pg.monotone_bad);
    MPI_Allreduce(&pg.total, &totals, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(totals == gc->nx * cols, "case %d: the ranks' progress totals add up to %lld, not %lld", idx, (long long)totals, (long long)(gc->nx * cols));
    if (rank_ == 0 && r == QK_OK) {
        size_t la = 0, lb = 0;
        char *a = qk_test_read_file(ref_path, &la), *b = qk_test_read_file(out_path, &lb);
        CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "case %d (%s, %lld x %lld, %s, %d ranks): the MPI .npy differs from one qk_gram's (%zu vs %zu bytes)",
              idx, gc->spec, (long long)gc->nx, (long long)cols, gc->dt == QK_F32 ? "f32" : "f64", size_, la, lb);
        free(a);
        free(b);
        CHECK(stray_files(sub, "ref.npy", "K.npy", stray, sizeof stray) == 0, "case %d: stray file '%s'", idx, stray);
    }

    /* tile callback: each entry once over all ranks, bitwise one qk_gram's */
    memset(&tc, 0, sizeof tc);
    tc.n = gc->nx; tc.cols = cols; tc.symmetric = gc->ny == 0; tc.dt = gc->dt;
    tc.val = (double *)calloc((size_t)(gc->nx * cols), sizeof(double));
    tc.count = (int *)calloc((size_t)(gc->nx * cols), sizeof(int));
    memset(&g, 0, sizeof g);
    g.x = x; g.n_x = gc->nx; g.y = y; g.n_y = gc->ny; g.out_dtype = gc->dt;
    g.output = QK_OUTPUT_CALLBACK; g.tile_fn = collect; g.tile_user = &tc;
    r = qk_gram_mpi(ctx, map, &g, MPI_COMM_WORLD);
    CHECK(r == QK_OK, "case %d: qk_gram_mpi callback: %s", idx, qk_last_error());
    CHECK(tc.bad_tile == 0 && tc.bad_lower == 0, "case %d: %d tiles outside K, %d diagonal-tile entries not mirrored", idx, tc.bad_tile, tc.bad_lower);
    /* the ranks' tiles are disjoint: summing them gives each entry (+ 0.0 elsewhere) exactly */
    MPI_Allreduce(MPI_IN_PLACE, tc.val, (int)(gc->nx * cols), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, tc.count, (int)(gc->nx * cols), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    {
        int64_t missing = 0, twice = 0, differ = 0;
        for (i = 0; i < gc->nx; i++)
            for (j = tc.symmetric ? i : 0; j < cols; j++) {
                double ref = gc->dt == QK_F32 ? (double)((float *)kref)[i * cols + j] : ((double *)kref)[i * cols + j];
                int c = tc.count[i * cols + j];
                if (c == 0) missing++;
                else if (c > 1) twice++;
                else if (memcmp(&ref, &tc.val[i * cols + j], sizeof ref) != 0) differ++;
            }
        CHECK(missing == 0 && twice == 0 && differ == 0, "case %d (%s, %d ranks): tiles: %lld entries missing, %lld delivered twice, %lld differ from qk_gram",
              idx, gc->spec, size_, (long long)missing, (long long)twice, (long long)differ);
    }

    /* the tunable mpi_block_bytes (0: QK_MPI_BLOCK_BYTES, 4 KB here): 1 MB blocks hold a whole
       band (fewer sub-jobs, so fewer and larger tiles over all ranks; where some band has more
       than 32 rows, the 4 KB blocks split it), and K is the same: tiles and the .npy bytes;
       mpi_sync_bytes 1 KB makes the writer thread sync after every block */
    if (gc->nx > 32 * size_) {
        tiles t2;
        int calls[2];
        memset(&t2, 0, sizeof t2);
        t2.n = gc->nx; t2.cols = cols; t2.symmetric = gc->ny == 0; t2.dt = gc->dt;
        t2.val = (double *)calloc((size_t)(gc->nx * cols), sizeof(double));
        t2.count = (int *)calloc((size_t)(gc->nx * cols), sizeof(int));
        g.tile_user = &t2;
        g.mpi_block_bytes = (size_t)1 << 20;
        r = qk_gram_mpi(ctx, map, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "case %d: qk_gram_mpi callback, mpi_block_bytes 1 MB: %s", idx, qk_last_error());
        MPI_Allreduce(MPI_IN_PLACE, t2.val, (int)(gc->nx * cols), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        calls[0] = tc.calls; calls[1] = t2.calls;
        MPI_Allreduce(MPI_IN_PLACE, calls, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(calls[1] < calls[0], "case %d: 1 MB blocks gave %d tiles, 4 KB blocks %d (fewer expected)", idx, calls[1], calls[0]);
        CHECK(memcmp(t2.val, tc.val, sizeof(double) * (size_t)(gc->nx * cols)) == 0, "case %d: K differs with mpi_block_bytes 1 MB", idx);
        free(t2.val);
        free(t2.count);
        g.output = QK_OUTPUT_NPY; g.out_path = out_path; g.tile_fn = NULL; g.tile_user = NULL;
        g.mpi_sync_bytes = 1024;
        r = qk_gram_mpi(ctx, map, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "case %d: qk_gram_mpi npy, mpi_block_bytes 1 MB: %s", idx, qk_last_error());
        if (rank_ == 0 && r == QK_OK) {
            size_t la = 0, lb = 0;
            char *a = qk_test_read_file(ref_path, &la), *b = qk_test_read_file(out_path, &lb);
            CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "case %d: the MPI .npy with 1 MB blocks differs from one qk_gram's", idx);
            free(a);
            free(b);
        }
    }
    free(tc.val);
    free(tc.count);
    free(kref);
    free(x);
    free(y);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
}

/* ---- failures ---- */
/* Runs qk_gram_mpi with rank `bad` (or every rank, bad < 0) made to fail by `how`; every rank must
   return `expect`, the detail must name rank `bad`, and out_path must keep its old content. */
enum { F_PROGRESS, F_TILE, F_NAN, F_DIFFERENT_X, F_NO_DIR, F_HOST };

static void check_failure(int how, int bad, qk_result expect, int idx) {
    static const char *names[] = {"progress cancels", "tile callback cancels", "NaN in X", "different X", "missing directory", "HOST output"};
    qk_ctx *ctx = qk_test_cpu_ctx(1);
    qk_map *map = NULL;
    const int64_t n = 53;
    double *x = samples(n, 3, 77);
    char sub[1100], out_path[1200], stray[256], want[64];
    const char *old = "old content\n";
    qk_gram_desc g;
    qk_result r;
    tiles tc;
    prog pg;
    int me = bad < 0 || rank_ == bad, ok;

    snprintf(sub, sizeof sub, "%s/fail%d", dir_, idx);
    if (rank_ == 0) mkdir(sub, 0777);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(out_path, sizeof out_path, how == F_NO_DIR ? "%s/missing/K.npy" : "%s/K.npy", sub);
    if (rank_ == 0 && how != F_NO_DIR) {
        FILE *f = fopen(out_path, "wb");
        fputs(old, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    qk_map_parse("zz(reps=1)", 3, &map);
    memset(&g, 0, sizeof g);
    memset(&pg, 0, sizeof pg);
    memset(&tc, 0, sizeof tc);
    tc.n = n; tc.cols = n; tc.symmetric = 1; tc.dt = QK_F64;
    tc.val = (double *)calloc((size_t)(n * n), sizeof(double));
    tc.count = (int *)calloc((size_t)(n * n), sizeof(int));
    g.x = x; g.n_x = n;
    g.output = QK_OUTPUT_NPY; g.out_path = out_path;
    g.progress = on_progress; g.progress_user = &pg;
    if (how == F_PROGRESS && me) pg.cancel_after = 2;   /* after its first slab */
    if (how == F_TILE) { g.output = QK_OUTPUT_CALLBACK; g.tile_fn = collect; g.tile_user = &tc; if (me) tc.cancel_after = 2; }
    if (how == F_NAN && me) x[(n - 1) * 3 + 1] = NAN;
    if (how == F_DIFFERENT_X && me) x[5] += 1e-9;
    if (how == F_HOST) { g.output = QK_OUTPUT_HOST; g.out = tc.val; }
    r = qk_gram_mpi(ctx, map, &g, MPI_COMM_WORLD);
    CHECK(r == expect, "failure %d (%s on rank %d of %d): rank %d returned %s (%s), expected %s", idx, names[how], bad, size_, rank_,
          qk_result_string(r), qk_last_error(), qk_result_string(expect));
    snprintf(want, sizeof want, "rank %d of %d: ", bad, size_);
    if (how == F_DIFFERENT_X)
        CHECK(strstr(qk_last_error(), "disagree on the data X") != NULL, "failure %d (%s): the detail '%s' does not say so", idx, names[how], qk_last_error());
    else if (size_ > 1)
        CHECK(strncmp(qk_last_error(), want, strlen(want)) == 0, "failure %d (%s): the detail '%s' does not start with '%s'", idx, names[how], qk_last_error(), want);
    if (how == F_PROGRESS || how == F_TILE)
        CHECK(strstr(qk_last_error(), "cancelled by a") != NULL, "failure %d (%s): the detail '%s' does not say cancelled", idx, names[how], qk_last_error());
    ok = all_ranks(r == expect);
    if (rank_ == 0 && ok) {
        size_t len = 0;
        char *s = how == F_NO_DIR ? NULL : qk_test_read_file(out_path, &len);
        if (how != F_NO_DIR) CHECK(s && len == strlen(old) && memcmp(s, old, len) == 0, "failure %d (%s): the old '%s' was changed", idx, names[how], out_path);
        free(s);
        CHECK(stray_files(sub, "K.npy", NULL, stray, sizeof stray) == 0, "failure %d (%s on rank %d): '%s' was left in %s", idx, names[how], bad, stray, sub);
    }
    free(tc.val);
    free(tc.count);
    free(x);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
}

/* ---- given states (qk_gram_mpi_states) ---- */
/* n random states of dim amplitudes (complex: interleaved), rows ld elements apart, unnormalised
   when `raw` (normalize = 1 then scales them); the padding of each row (ld > dim) is filled with
   `pad` (different on each rank: it is not data). */
static double *random_states(int64_t n, int64_t dim, int64_t ld, int cplx, int raw, uint64_t seed, double pad) {
    const int c = cplx ? 2 : 1;
    double *s = (double *)malloc(sizeof(double) * (size_t)(n * ld * c));
    int64_t i, k;
    qk_test_seed_set(seed);
    for (i = 0; i < n; i++) {
        double ss = 0;
        for (k = 0; k < dim * c; k++) {
            s[i * ld * c + k] = qk_test_urand() - 0.5;
            ss += s[i * ld * c + k] * s[i * ld * c + k];
        }
        for (k = 0; k < dim * c && !raw; k++) s[i * ld * c + k] /= sqrt(ss);
        for (k = dim * c; k < ld * c; k++) s[i * ld * c + k] = pad;
    }
    return s;
}

/* ---- a state provider on each rank ---- */
/* Gives the rows of host states a and b (nel elements of esize bytes, ld elements apart) and
   counts, row by row, what this rank asked for. fail_*: the chunk holding that row fails (fail
   1: the provider returns non-zero; 2: it gives a NaN in the row; 3: it gives the row changed
   (one amplitude's sign) on this rank only, a provider that disagrees with the other ranks';
   4: it gives the row changed from its second request on, a provider that is not the same
   twice). */
typedef struct prov {
    const char *a, *b;
    int64_t nel, ld, esize, n_a, n_b;
    int64_t *asked[2];      /* per row of A and B: times this rank was given it */
    int fail, fail_side;
    int64_t fail_row;
} prov;

static void prov_init(prov *p, const void *a, int64_t n_a, const void *b, int64_t n_b, int64_t nel, int64_t ld, int64_t esize) {
    memset(p, 0, sizeof *p);
    p->a = (const char *)a; p->b = (const char *)b;
    p->n_a = n_a; p->n_b = n_b; p->nel = nel; p->ld = ld; p->esize = esize;
    p->asked[0] = (int64_t *)calloc((size_t)n_a, sizeof(int64_t));
    p->asked[1] = (int64_t *)calloc((size_t)(n_b ? n_b : 1), sizeof(int64_t));
    p->fail_row = -1;
}

static void prov_free(prov *p) {
    free(p->asked[0]);
    free(p->asked[1]);
}

static int give_rows(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user) {
    prov *p = (prov *)user;
    const char *src = side ? p->b : p->a;
    int64_t i;
    if (i0 < 0 || i1 <= i0 || i1 > (side ? p->n_b : p->n_a) || !src) return 1;   /* rows outside the states: a bug */
    for (i = i0; i < i1; i++) {
        char *row = (char *)buf + (size_t)((i - i0) * ld * p->esize);
        p->asked[side][i]++;
        memcpy(row, src + (size_t)(i * p->ld * p->esize), (size_t)(p->nel * p->esize));
        if (p->fail && side == p->fail_side && i == p->fail_row) {
            double v;
            if (p->fail == 1) return 1;
            memcpy(&v, row, sizeof v);
            if (p->fail == 2) v = NAN;
            if (p->fail == 3 || (p->fail == 4 && p->asked[side][i] > 1)) v = -v;
            memcpy(row, &v, sizeof v);
        }
    }
    return 0;
}

/* K from given states over the ranks: the .npy is byte for byte the one qk_gram_states writes in
   one process (rank 0), the tiles bitwise its K. */
typedef struct scase { const char *what; qk_state_type type; int64_t dim, na, nb, ld; int normalize, mixed; } scase;

static void check_states_case(const scase *sc, int idx) {
    qk_ctx *ctx = qk_test_cpu_ctx(1);
    const int cplx = sc->type == QK_STATE_C128;
    const int64_t nel = sc->mixed ? sc->dim * sc->dim : sc->dim, ld = sc->ld ? sc->ld : nel, cols = sc->nb ? sc->nb : sc->na;
    double *a = NULL, *b = NULL, *kref = (double *)malloc(sizeof(double) * (size_t)(sc->na * cols));
    char sub[1100], ref_path[1200], out_path[1200], stray[256];
    qk_states_desc st;
    qk_gram_desc g;
    qk_result r;
    tiles tc;
    int64_t i, j;
    if (sc->mixed) {   /* density matrices: sums of two outer products, trace 1 */
        int64_t n, s2;
        a = (double *)calloc((size_t)((sc->na + sc->nb) * ld), sizeof(double));
        for (n = 0; n < sc->na + sc->nb; n++) {
            double *m = a + n * ld;
            double *v = random_states(2, sc->dim, sc->dim, 0, 0, 900 + (uint64_t)(idx * 100 + n), 0.0);
            for (s2 = 0; s2 < 2; s2++)
                for (i = 0; i < sc->dim; i++)
                    for (j = 0; j < sc->dim; j++) m[i * sc->dim + j] += (s2 ? 0.25 : 0.75) * v[s2 * sc->dim + i] * v[s2 * sc->dim + j];
            for (i = sc->dim * sc->dim; i < ld; i++) m[i] = 1000.0 + rank_;
            free(v);
        }
        b = sc->nb ? a + sc->na * ld : NULL;
    } else {
        a = random_states(sc->na, sc->dim, ld, cplx, sc->normalize, 300 + (uint64_t)idx, 1000.0 + rank_);
        b = sc->nb ? random_states(sc->nb, sc->dim, ld, cplx, sc->normalize, 400 + (uint64_t)idx, 2000.0 + rank_) : NULL;
    }
    snprintf(sub, sizeof sub, "%s/states%d", dir_, idx);
    if (rank_ == 0) mkdir(sub, 0777);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(ref_path, sizeof ref_path, "%s/ref.npy", sub);
    snprintf(out_path, sizeof out_path, "%s/K.npy", sub);
    memset(&st, 0, sizeof st);
    st.type = sc->type; st.dim = sc->dim; st.a = a; st.n_a = sc->na; st.lda = ld;
    st.b = b; st.n_b = sc->nb; st.ldb = ld; st.normalize = sc->normalize;
    st.a_mixed = st.b_mixed = sc->mixed;

    /* one process: a host K on every rank, the .npy on rank 0 */
    memset(&g, 0, sizeof g);
    g.out = kref;
    r = qk_gram_states(ctx, &st, &g);
    CHECK(r == QK_OK, "states %d (%s): qk_gram_states: %s", idx, sc->what, qk_last_error());
    if (rank_ == 0) {
        g.output = QK_OUTPUT_NPY; g.out = NULL; g.out_path = ref_path;
        r = qk_gram_states(ctx, &st, &g);
        CHECK(r == QK_OK, "states %d (%s): qk_gram_states npy: %s", idx, sc->what, qk_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);

    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_NPY; g.out_path = out_path; g.no_sync = 1;
    r = qk_gram_mpi_states(ctx, &st, &g, MPI_COMM_WORLD);
    CHECK(r == QK_OK, "states %d (%s): qk_gram_mpi_states npy: %s", idx, sc->what, qk_last_error());
    if (rank_ == 0 && r == QK_OK) {
        size_t la = 0, lb = 0;
        char *fa = qk_test_read_file(ref_path, &la), *fb = qk_test_read_file(out_path, &lb);
        CHECK(fa && fb && la == lb && memcmp(fa, fb, la) == 0, "states %d (%s, %d ranks): the MPI .npy differs from qk_gram_states' (%zu vs %zu bytes)",
              idx, sc->what, size_, la, lb);
        free(fa);
        free(fb);
        CHECK(stray_files(sub, "ref.npy", "K.npy", stray, sizeof stray) == 0, "states %d: stray file '%s'", idx, stray);
    }

    /* tiles: each entry once over the ranks, bitwise */
    memset(&tc, 0, sizeof tc);
    tc.n = sc->na; tc.cols = cols; tc.symmetric = sc->nb == 0; tc.dt = QK_F64;
    tc.val = (double *)calloc((size_t)(sc->na * cols), sizeof(double));
    tc.count = (int *)calloc((size_t)(sc->na * cols), sizeof(int));
    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_CALLBACK; g.tile_fn = collect; g.tile_user = &tc;
    r = qk_gram_mpi_states(ctx, &st, &g, MPI_COMM_WORLD);
    CHECK(r == QK_OK, "states %d (%s): qk_gram_mpi_states callback: %s", idx, sc->what, qk_last_error());
    MPI_Allreduce(MPI_IN_PLACE, tc.val, (int)(sc->na * cols), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, tc.count, (int)(sc->na * cols), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    {
        int64_t bad = 0;
        for (i = 0; i < sc->na; i++)
            for (j = tc.symmetric ? i : 0; j < cols; j++)
                if (tc.count[i * cols + j] != 1 || memcmp(&kref[i * cols + j], &tc.val[i * cols + j], sizeof(double)) != 0) bad++;
        CHECK(bad == 0 && tc.bad_tile == 0, "states %d (%s, %d ranks): %lld entries of the tiles missing, twice or not qk_gram_states'",
              idx, sc->what, size_, (long long)bad);
    }
    free(tc.val);
    free(tc.count);

    /* the same states through a provider on each rank, asked for block by block: the .npy byte
       for byte, the tiles bitwise, and each rank asks only for the rows of its blocks */
    {
        const int64_t esize = sc->type == QK_STATE_C128 ? 16 : 8;
        qk_states_desc sp = st;
        qk_schedule_desc sd;
        qk_schedule sch;
        prov pv;
        int64_t r0, r1, outside = 0, missed = 0, wrong = 0, s;
        prov_init(&pv, a, sc->na, b, sc->nb, nel, ld, esize);
        sp.a = sp.b = NULL; sp.lda = sp.ldb = 0;
        sp.provider = give_rows; sp.provider_user = &pv;
        memset(&sd, 0, sizeof sd);
        sd.n_x = sc->na; sd.n_y = sc->nb; sd.n_workers = size_;
        CHECK(qk_schedule_make(&sd, &sch) == QK_OK, "states %d: qk_schedule_make: %s", idx, qk_last_error());
        r0 = sch.row0[rank_]; r1 = sch.row0[rank_ + 1];
        qk_schedule_free(&sch);

        /* .npy, the small blocks (QK_MPI_BLOCK_BYTES 4 KB: a band in many blocks) */
        if (rank_ == 0) remove(out_path);
        MPI_Barrier(MPI_COMM_WORLD);
        memset(&g, 0, sizeof g);
        g.output = QK_OUTPUT_NPY; g.out_path = out_path; g.no_sync = 1;
        r = qk_gram_mpi_states(ctx, &sp, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "states %d (%s): qk_gram_mpi_states npy, a provider: %s", idx, sc->what, qk_last_error());
        if (rank_ == 0 && r == QK_OK) {
            size_t la = 0, lb = 0;
            char *fa = qk_test_read_file(ref_path, &la), *fb = qk_test_read_file(out_path, &lb);
            CHECK(fa && fb && la == lb && memcmp(fa, fb, la) == 0, "states %d (%s, %d ranks): the MPI .npy from a provider differs from "
                  "qk_gram_states' (%zu vs %zu bytes)", idx, sc->what, size_, la, lb);
            free(fa);
            free(fb);
        }
        /* a rank's blocks hold its band's rows x the columns from its band on (K(A,A)) or all
           columns (K(A,B)): rows of A before its band (K(A,A)) or outside it (K(A,B)) are never
           asked for; every row of its band is, and for K(A,B) every row of B */
        for (s = 0; s < sc->na; s++) {
            const int in_band = s >= r0 && s < r1, needed = in_band || (!sc->nb && r1 > r0 && s >= r1);
            if (!needed && pv.asked[0][s]) outside++;
            if (in_band && !pv.asked[0][s]) missed++;
        }
        for (s = 0; s < sc->nb; s++)
            if ((r1 > r0) != (pv.asked[1][s] > 0)) missed++;
        CHECK(outside == 0 && missed == 0, "states %d (%s, rank %d, band [%lld, %lld)): a provider was asked for %lld rows outside its blocks "
              "and not for %lld rows of them", idx, sc->what, rank_, (long long)r0, (long long)r1, (long long)outside, (long long)missed);

        /* the 4 KB blocks: slabs of 22 rows; where a slab's rows fit the 4 KB (22 stored rows,
           each dim or dim^2 elements rounded up to whole doubles), each slab asks once for its
           rows, kept for its blocks, and each block once for its columns' rows. K(A,A): a band
           row once for its slab and once for each slab of the band above it, a row past the band
           once for each slab; K(A,B): a band row once, a row of B once for each slab */
        {
            const int64_t rowb = (nel * esize + 7) / 8 * 8, S = 22;
            int64_t slabs_above, slabs = r1 > r0 ? (r1 - r0 + S - 1) / S : 0;
            if (S * rowb <= 4096) {
                for (s = 0; s < sc->na; s++) {
                    slabs_above = s < r0 ? 0 : s >= r1 ? slabs : (s - r0) / S;
                    if (pv.asked[0][s] != (s >= r0 && s < r1 ? 1 : 0) + (sc->nb ? 0 : slabs_above)) wrong++;
                }
                for (s = 0; s < sc->nb; s++)
                    if (pv.asked[1][s] != slabs) wrong++;
                CHECK(wrong == 0, "states %d (%s, rank %d, band [%lld, %lld), 4 KB blocks): %lld rows asked for a number of times other "
                      "than its slabs and blocks need (each slab's rows once)", idx, sc->what, rank_, (long long)r0, (long long)r1, (long long)wrong);
            }
        }

        /* tiles, blocks of 1 MB: a band is one slab, so a rank's blocks are the diagonal block
           of its band [r0, r1) and (K(A,A), r1 < n) the rectangle [r0, r1) x [r1, n), or
           (K(A,B)) the rectangle [r0, r1) x B: the slab asks once for its rows (kept for both
           blocks), each block once for its columns' rows. K(A,A): a band row once, a row past
           the band once; K(A,B): a band row once and every row of B once (an empty band:
           nothing) */
        memset(pv.asked[0], 0, sizeof(int64_t) * (size_t)sc->na);
        memset(pv.asked[1], 0, sizeof(int64_t) * (size_t)(sc->nb ? sc->nb : 1));
        wrong = 0;
        memset(&tc, 0, sizeof tc);
        tc.n = sc->na; tc.cols = cols; tc.symmetric = sc->nb == 0; tc.dt = QK_F64;
        tc.val = (double *)calloc((size_t)(sc->na * cols), sizeof(double));
        tc.count = (int *)calloc((size_t)(sc->na * cols), sizeof(int));
        memset(&g, 0, sizeof g);
        g.output = QK_OUTPUT_CALLBACK; g.tile_fn = collect; g.tile_user = &tc; g.mpi_block_bytes = (size_t)1 << 20;
        r = qk_gram_mpi_states(ctx, &sp, &g, MPI_COMM_WORLD);
        CHECK(r == QK_OK, "states %d (%s): qk_gram_mpi_states callback, a provider: %s", idx, sc->what, qk_last_error());
        MPI_Allreduce(MPI_IN_PLACE, tc.val, (int)(sc->na * cols), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, tc.count, (int)(sc->na * cols), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        {
            int64_t bad = 0;
            for (i = 0; i < sc->na; i++)
                for (j = tc.symmetric ? i : 0; j < cols; j++)
                    if (tc.count[i * cols + j] != 1 || memcmp(&kref[i * cols + j], &tc.val[i * cols + j], sizeof(double)) != 0) bad++;
            CHECK(bad == 0 && tc.bad_tile == 0, "states %d (%s, %d ranks): a provider's tiles: %lld entries missing, twice or not qk_gram_states'",
                  idx, sc->what, size_, (long long)bad);
        }
        for (s = 0; s < sc->na; s++) {
            const int64_t want = r1 <= r0 || s < r0 ? 0 : s < r1 ? 1 : (sc->nb ? 0 : 1);
            if (pv.asked[0][s] != want) wrong++;
        }
        for (s = 0; s < sc->nb; s++)
            if (pv.asked[1][s] != (r1 > r0 ? 1 : 0)) wrong++;
        CHECK(wrong == 0, "states %d (%s, rank %d, band [%lld, %lld), 1 MB blocks): %lld rows asked for a number of times other than "
              "its blocks need", idx, sc->what, rank_, (long long)r0, (long long)r1, (long long)wrong);
        free(tc.val);
        free(tc.count);
        prov_free(&pv);
    }
    free(kref);
    free(a);
    if (!sc->mixed) free(b);
    qk_ctx_destroy(ctx);
}

/* A bad state (how: 0 NaN in A on every rank, 1 a norm off 1 in B on every rank, 2 NaN in A on
   rank `bad` only, 3 A that differs on rank `bad`, 4 a provider, 5 dim 1, which the states' map
   refuses: its message names qk_gram_mpi_states, not qk_gram_states; 6 to 10 a provider's rows,
   pv.fail = how - 5, 9 with 64-byte blocks (slabs of 2 rows, blocks of 2 x 4), whose slabs' rows
   (256 bytes) do not fit them, so that each block asks for its rows, 10 with the 4 KB blocks, whose slabs of 22 rows are kept): every rank returns `expect`
   with the same detail, naming the row; out_path keeps its old content and no file is left. */
static int no_rows(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user) {
    (void)side; (void)i0; (void)i1; (void)buf; (void)ld; (void)user;
    return 1;
}

static void check_states_failure(int how, int bad, qk_result expect, const char *want, int idx, int64_t fail_row) {
    static const char *names[] = {"NaN in A", "a norm off 1 in B", "NaN in A on one rank", "A differs on one rank", "a provider that fails on every rank",
                                   "dim 1", "a provider fails on one rank", "a provider gives NaN on one rank",
                                   "a provider unlike the other ranks'", "a provider unlike itself (rows asked per block)",
                                   "a provider unlike itself (a slab's rows kept)"};
    prov pv;
    qk_ctx *ctx = qk_test_cpu_ctx(1);
    const int64_t n = 29, dim = 8;
    double *a = random_states(n, dim, dim, 1, 0, 71, 0.0), *b = random_states(17, dim, dim, 1, 0, 72, 0.0);
    char sub[1100], out_path[1200], stray[256], mine[512], *all = NULL;
    const char *old = "old content\n";
    qk_states_desc st;
    qk_gram_desc g;
    qk_result r;
    int ok, k, same = 1;
    snprintf(sub, sizeof sub, "%s/sfail%d", dir_, idx);
    if (rank_ == 0) mkdir(sub, 0777);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(out_path, sizeof out_path, "%s/K.npy", sub);
    if (rank_ == 0) {
        FILE *f = fopen(out_path, "wb");
        fputs(old, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    memset(&st, 0, sizeof st);
    st.type = QK_STATE_C128; st.dim = dim; st.a = a; st.n_a = n;
    if (how == 0) a[2 * (13 * dim + 5) + 1] = NAN;
    if (how == 1) { st.b = b; st.n_b = 17; b[2 * (5 * dim)] += 0.01; }
    if (how == 2 && rank_ == bad) a[2 * (13 * dim + 5) + 1] = NAN;
    if (how == 3 && rank_ == bad) a[2 * (7 * dim + 2)] = -a[2 * (7 * dim + 2)];
    if (how == 4) { st.a = NULL; st.provider = no_rows; }
    if (how >= 6) {   /* a provider of A's rows that fails on rank `bad` (every rank for bad < 0) */
        prov_init(&pv, a, n, NULL, 0, dim, dim, 16);
        st.a = NULL; st.provider = give_rows; st.provider_user = &pv;
        if (bad < 0 || rank_ == bad) {
            pv.fail = how < 10 ? how - 5 : 4;   /* 1 fails, 2 NaN, 3 a row unlike the other ranks', 4 a row unlike its first */
            pv.fail_side = 0;
            pv.fail_row = fail_row;
        }
    }
    if (how == 5) st.dim = 1;
    memset(&g, 0, sizeof g);
    g.output = QK_OUTPUT_NPY; g.out_path = out_path;
    if (how == 9) g.mpi_block_bytes = 64;
    r = qk_gram_mpi_states(ctx, &st, &g, MPI_COMM_WORLD);
    CHECK(r == expect, "states failure %d (%s, rank %d of %d): rank %d returned %s (%s), expected %s", idx, names[how], bad, size_, rank_,
          qk_result_string(r), qk_last_error(), qk_result_string(expect));
    CHECK(strstr(qk_last_error(), want) != NULL, "states failure %d (%s): the detail '%s' does not say '%s'", idx, names[how], qk_last_error(), want);
    /* every rank's detail is the same */
    memset(mine, 0, sizeof mine);
    snprintf(mine, sizeof mine, "%s", qk_last_error());
    if (rank_ == 0) all = (char *)malloc(sizeof mine * (size_t)size_);
    MPI_Gather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (k = 1; rank_ == 0 && k < size_; k++)
        if (strcmp(all, all + k * sizeof mine) != 0) same = 0;
    CHECK(same, "states failure %d (%s): the ranks' details differ ('%s' on rank 0)", idx, names[how], mine);
    free(all);
    ok = all_ranks(r == expect);
    if (rank_ == 0 && ok) {
        size_t len = 0;
        char *s = qk_test_read_file(out_path, &len);
        CHECK(s && len == strlen(old) && memcmp(s, old, len) == 0, "states failure %d (%s): the old '%s' was changed", idx, names[how], out_path);
        free(s);
        CHECK(stray_files(sub, "K.npy", NULL, stray, sizeof stray) == 0, "states failure %d (%s): '%s' was left in %s", idx, names[how], stray, sub);
    }
    if (how >= 6) prov_free(&pv);
    free(a);
    free(b);
    qk_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
    static const gcase cases[] = {
        {"zz(reps=2)", 3, 37, 0, QK_F64},             /* complex: orientation changes the last bit */
        {"iqp", 4, 131, 0, QK_F32},
        {"zz(reps=2,ent=linear)", 3, 45, 29, QK_F64}, /* K(X,Y) */
        {"hea(layers=2)", 3, 67, 0, QK_F64},          /* real */
        {"angle(rot=y)", 5, 41, 0, QK_F64},           /* product (analytic) */
        {"iqp", 3, 23, 61, QK_F32},                   /* K(X,Y), wider than tall */
        {"zz", 2, 2, 0, QK_F64},                      /* fewer rows than ranks */
    };
    static const scase scases[] = {
        {"complex128 K(A,A)", QK_STATE_C128, 16, 53, 0, 0, 0, 0},
        {"complex128 K(A,B), lda > dim (padding differs by rank), normalize", QK_STATE_C128, 8, 37, 23, 11, 1, 0},
        {"float64 K(A,A), dim 6 (zero-padded to 8)", QK_STATE_F64, 6, 41, 0, 0, 0, 0},
        {"density matrices K(A,B), ld > dim^2", QK_STATE_F64, 4, 19, 13, 17, 0, 1},
        {"complex128, fewer states than ranks", QK_STATE_C128, 4, 2, 0, 0, 0, 0},
    };
    int i, k, idx = 0, want = MPI_THREAD_SINGLE, got = 0;
    /* argv[2]: the thread level asked for: qk_gram_mpi writes from a second thread from
       MPI_THREAD_SERIALIZED on, and inline below it (both are run by test_mpi.py) */
    if (argc > 2) want = !strcmp(argv[2], "multiple") ? MPI_THREAD_MULTIPLE : !strcmp(argv[2], "serialized") ? MPI_THREAD_SERIALIZED : MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, want, &got);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (argc > 1 && !strcmp(argv[1], "--probe")) { MPI_Finalize(); return 0; }
    if (argc != 2 && argc != 3) {
        if (rank_ == 0) fprintf(stderr, "usage: mpirun -n R test_mpi DIR [single|serialized|multiple]\n");
        MPI_Finalize();
        return 2;
    }
    snprintf(dir_, sizeof dir_, "%s", argv[1]);

    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) check_case(&cases[i], i);

    for (k = 0; k < size_; k++) {   /* each rank in turn is the one that fails */
        check_failure(F_PROGRESS, k, QK_ERROR_CANCELLED, idx++);
        check_failure(F_TILE, k, QK_ERROR_CANCELLED, idx++);
        check_failure(F_NAN, k, QK_ERROR_NON_FINITE, idx++);
        if (size_ > 1) check_failure(F_DIFFERENT_X, k, QK_ERROR_INVALID_ARGUMENT, idx++);
    }
    check_failure(F_NO_DIR, 0, QK_ERROR_IO, idx++);
    check_failure(F_HOST, 0, QK_ERROR_UNSUPPORTED, idx++);

    for (i = 0; i < (int)(sizeof scases / sizeof scases[0]); i++) check_states_case(&scases[i], i);
    {
        char w[200];
        idx = 0;
        char pre[64];
        qk_schedule_desc sd;
        qk_schedule sch;
        check_states_failure(0, -1, QK_ERROR_NON_FINITE, "A[13]: amplitude 5 is NaN", idx++, -1);
        check_states_failure(1, -1, QK_ERROR_BAD_DATA, "B[5]: the state's squared norm is", idx++, -1);
        for (k = 0; k < size_; k++) {
            snprintf(w, sizeof w, size_ > 1 ? "rank %d of %d: A[13]: amplitude 5 is NaN" : "A[13]", k, size_);
            check_states_failure(2, k, QK_ERROR_NON_FINITE, w, idx++, -1);
            if (size_ > 1) check_states_failure(3, k, QK_ERROR_INVALID_ARGUMENT, "disagree on the states A", idx++, -1);
        }
        /* a provider (29 states of dim 8, K(A,A)): rank k's band starts at row0[k], which its
           diagonal block asks for first (its own chunk), the last row every rank asks for */
        memset(&sd, 0, sizeof sd);
        sd.n_x = 29; sd.n_workers = size_;
        CHECK(qk_schedule_make(&sd, &sch) == QK_OK, "qk_schedule_make: %s", qk_last_error());
        /* failing on every rank: the first rank to fail stops the others (which one is a race) */
        check_states_failure(4, -1, QK_ERROR_CANCELLED, "qk_gram_mpi_states: the state provider failed for A rows [", idx++, -1);
        for (k = 0; k < size_; k++) {
            const long long r0 = (long long)sch.row0[k];
            if (size_ > 1) snprintf(pre, sizeof pre, "rank %d of %d: ", k, size_);
            else pre[0] = 0;
            snprintf(w, sizeof w, "%sqk_gram_mpi_states: the state provider failed for A rows [%lld, ", pre, r0);
            check_states_failure(6, k, QK_ERROR_CANCELLED, w, idx++, sch.row0[k]);
            snprintf(w, sizeof w, "%sA[%lld]: amplitude 0 is NaN", pre, r0);
            check_states_failure(7, k, QK_ERROR_NON_FINITE, w, idx++, sch.row0[k]);
            if (size_ > 1) check_states_failure(8, k, QK_ERROR_INVALID_ARGUMENT, "the ranks' state providers gave different rows for A[28] "
                                                "(a provider must give the same row", idx++, 28);
            /* a row asked for twice. 64-byte blocks (rows not kept): the band's first, in its
               diagonal block and the rectangle right of it (every band but the last of several).
               4 KB blocks (a slab's rows kept): the first row of a band's second slab, asked for
               by the first slab's blocks as a column and by its own slab (a band of more than 22
               rows: one rank's 29) */
            if (size_ == 1 || k < size_ - 1) {
                snprintf(w, sizeof w, "%sqk_gram_mpi_states: the state provider gave A[%lld] twice, different each time", pre, r0);
                check_states_failure(9, k, QK_ERROR_BAD_DATA, w, idx++, sch.row0[k]);
            }
            if (sch.row0[k + 1] - sch.row0[k] > 22) {
                snprintf(w, sizeof w, "%sqk_gram_mpi_states: the state provider gave A[%lld] twice, different each time", pre, r0 + 22);
                check_states_failure(10, k, QK_ERROR_BAD_DATA, w, idx++, sch.row0[k] + 22);
            }
        }
        qk_schedule_free(&sch);
        check_states_failure(5, -1, QK_ERROR_INVALID_ARGUMENT, "qk_gram_mpi_states: dim must be >= 2", idx++, -1);
    }

    {
        int total = 0;
        MPI_Allreduce(&qk_test_fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank_ == 0)
            printf("test_mpi: %d ranks, thread level %d asked, %d provided (writer thread %s): %s (%d failures)\n", size_, want, got,
                   got >= MPI_THREAD_SERIALIZED ? "on" : "off", total ? "FAILED" : "ok", total);
        MPI_Finalize();
        return total ? 1 : 0;
    }
}
