/* qk-gram-mpi — qk-gram's main job over the ranks of an MPI job.

     mpirun -n R qk-gram-mpi --map SPEC --x X.npy [--y Y.npy] --out K.npy [options]
     mpirun -n R qk-gram-mpi --states A.npy [--states-y B.npy] --out K.npy [options]

   Rank 0 reads X (and Y) and broadcasts them; every rank computes its band of rows of K
   (qk_gram_mpi: rows dealt by pair count) on the CPU engine or, with --device cuda / auto in a
   CUDA build, on GPU (node-local rank mod GPUs of the node), and writes it into the one .npy
   file with MPI-IO. The file appears (renamed from a temporary file by rank 0) only when every
   rank succeeded; on any rank's failure no file is left and every rank exits 1. The output
   directory must be on a file system every rank sees. docs/scale.md has the details. --states
   takes the states themselves (qk_gram_mpi_states): rank 0 checks the files' headers as
   qk-gram --states does (options.h, io.c), then each rank reads only the rows its blocks need
   through a state provider (open_states); Fortran-order files and a pure side against density
   matrices are read by rank 0 and broadcast (read_bcast_states).

   Exit status: 0 success, 1 error, 2 bad command line, 130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP. */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime, sigaction, access under strict -std=c11 */
#define QK_MPI
#define QK_IMPLEMENTATION
#include "qk.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "options.h"   /* what qk-gram and qk-gram-mpi share */

#define EXIT_USAGE 2

static const char *usage_text =
    "usage: mpirun -n R qk-gram-mpi --map SPEC --x X.npy [--y Y.npy] --out K.npy [options]\n"
    "       mpirun -n R qk-gram-mpi --states A.npy [--states-y B.npy] --out K.npy [options]\n"
    "\n"
    "qk-gram over MPI ranks: K[i][j] = |<psi(x_i)|psi(y_j)>|^2, rows dealt to the ranks by pair\n"
    "count, written into one .npy file with MPI-IO (complete or absent).\n"
    "\n"
    "  --map SPEC        feature map (docs/maps.md), e.g. 'zz(reps=2)'\n"
    "  --x FILE          samples (.npy or .csv), read by rank 0\n"
    "  --y FILE          second sample set: K = K(X, Y) (default K(X, X))\n"
    "  --out FILE        output .npy, on a file system every rank sees\n"
    "  --states FILE     instead of --map and --x: the states themselves, a .npy of shape\n"
    "                    (n, dim) (statevectors, complex or real) or (n, dim, dim) (density\n"
    "                    matrices: K = Tr(rho_i rho_j)) on a file system every rank sees;\n"
    "                    each rank reads only the rows it needs (Fortran order: rank 0\n"
    "                    reads the file and broadcasts it); docs/states.md\n"
    "  --states-y FILE   second set of states: K = K(A, B) (default K(A, A))\n"
    "  --normalize       --states: scale each state to norm 1 (each matrix to trace 1)\n"
    "  --norm-tol T      --states: accepted |<a|a> - 1| (default 1e-9; float32/complex64: 1e-5)\n"
    "  --device D        cpu (default), cuda, auto; a GPU build gives rank r of a node GPU\n"
    "                    r mod (GPUs of the node)\n"
    "  --precision P     fp32 or fp64 (output float32 / float64; default fp64 on the CPU,\n"
    "                    auto on the GPU), the GPU's tensor-core modes fp32x3, tf32, fp16, or\n"
    "                    auto: the fastest mode whose error bound meets --tol (as qk-gram;\n"
    "                    docs/precision.md); the CPU engine computes in fp64 whatever is asked\n"
    "  --tol T           largest acceptable error bound of K for auto (default: fp32's)\n"
    "  --weights FILE    trainable weights of the map\n"
    "  --threads N       CPU engine threads per rank (default: cores / ranks on the node)\n"
    "  --no-sync         skip the final sync of the file (faster, not durable)\n"
    "  --quiet           print errors only\n"
    "  --autotune, --no-autotune, --cache-dir DIR   as qk-gram (GPU)\n"
    "  --help, --version\n";

typedef struct options {
    const char *map, *x, *y, *out, *weights, *cache_dir;
    const char *states, *states_y;   /* --states, --states-y: K from given states */
    qk_device device;
    qk_precision precision;
    double tol, norm_tol;
    int threads, quiet, no_sync, autotune, normalize;
} options;

static int g_rank = 0, g_size = 1;




static void die_usage(const char *fmt, ...) {
    va_list ap;
    if (g_rank == 0) {
        fprintf(stderr, "qk-gram-mpi: ");
        va_start(ap, fmt);
        qkcli_put_msg(fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n(qk-gram-mpi --help shows the options)\n");
    }
    MPI_Finalize();
    exit(EXIT_USAGE);
}

/* Prints "qk-gram-mpi: error: <what>: <qk detail>" (rank 0 only: every rank has the same error,
   unless `mine` says that this rank's own error is meant) and returns EXIT_FAILURE. */
static int fail(int mine, qk_result r, const char *fmt, ...) {
    va_list ap;
    if (g_rank != 0 && !mine) return EXIT_FAILURE;
    fprintf(stderr, "qk-gram-mpi: error: ");
    if (mine && g_size > 1) fprintf(stderr, "rank %d: ", g_rank);
    va_start(ap, fmt);
    qkcli_put_msg(fmt, ap);
    va_end(ap);
    if (r != QK_OK) fprintf(stderr, ": %s", *qk_last_error() ? qk_last_error() : qk_result_string(r));   /* escaped by qk */
    fprintf(stderr, "\n");
    return EXIT_FAILURE;
}

/* 1 on every rank when any rank passes a non-zero flag */
static int any(int flag) {
    int all = 0;
    MPI_Allreduce(&flag, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}


/* Rank 0 reads a .npy / .csv array (2-D samples when `samples`); every rank gets it. */
static int read_bcast(const char *what, const char *path, int samples, qk_array *a) {
    int bad = 0;
    int64_t shape[3] = {0, 0, 0}, off;
    memset(a, 0, sizeof *a);
    if (g_rank == 0) {
        qk_result r = QK_ERROR_FORMAT;
        if (!qkcli_ends_with(path, ".npy") && !qkcli_ends_with(path, ".csv")) bad = fail(0, QK_OK, "%s: '%s' is neither .npy nor .csv", what, qkcli_arg(path));
        else if ((r = qkcli_ends_with(path, ".npy") ? qk_npy_read(path, a) : qk_csv_read(path, a)) != QK_OK) bad = fail(0, r, "cannot read %s", what);
        else if (samples && (a->ndim != 2 || a->rows < 1 || a->cols < 1))
            bad = fail(0, QK_OK, "%s: '%s' must be 2-D (n_samples, n_features) with at least one of each", what, qkcli_arg(path));
        shape[0] = a->rows;
        shape[1] = a->cols;
        shape[2] = a->ndim;
    }
    if (any(bad)) { qk_array_free(a); return EXIT_FAILURE; }
    MPI_Bcast(shape, 3, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (g_rank != 0) {
        a->rows = shape[0];
        a->cols = shape[1];
        a->ndim = (int)shape[2];
        a->data = (double *)malloc(sizeof(double) * (size_t)(a->rows * a->cols > 0 ? a->rows * a->cols : 1));
        bad = a->data == NULL;
    }
    if (any(bad)) { qk_array_free(a); return fail(bad, QK_ERROR_OUT_OF_MEMORY, "%s: out of memory", what); }
    for (off = 0; off < a->rows * a->cols; off += 1 << 26) {   /* MPI counts are int */
        int64_t c = a->rows * a->cols - off < (1 << 26) ? a->rows * a->cols - off : (1 << 26);
        MPI_Bcast(a->data + off, (int)c, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    return EXIT_SUCCESS;
}

/* --states: rank 0 reads A (and B) and makes their qk_states_desc as qk-gram does (options.h);
   every rank gets the states (in their one type) and the same desc in *st. A converted side's
   copy is in conv (free()). */
static int read_bcast_states(const options *o, qk_states_array *A, qk_states_array *B, void *conv[2], qk_states_desc *st) {
    char msg[1024];
    int bad = 0, side;
    int64_t hdr[7] = {0, 0, 0, 0, 0, 0, 0};
    double tol = 0.0;
    qk_result r = QK_OK;
    memset(A, 0, sizeof *A);
    memset(B, 0, sizeof *B);
    if (g_rank == 0) {
        bad = qkcli_read_states("A", "--states", o->states, A, msg, sizeof msg, &r) ||
              (o->states_y && qkcli_read_states("B", "--states-y", o->states_y, B, msg, sizeof msg, &r)) ||
              qkcli_states_desc(A, B, o->states, o->states_y, o->normalize, o->norm_tol, conv, st, msg, sizeof msg, &r);
        if (bad) fail(0, r, "%s", msg);
        hdr[0] = (int64_t)st->type; hdr[1] = st->dim; hdr[2] = A->n; hdr[3] = A->mixed; hdr[4] = B->n; hdr[5] = B->mixed;
        hdr[6] = st->normalize;
        tol = st->norm_tol;
    }
    if (any(bad)) return EXIT_FAILURE;
    MPI_Bcast(hdr, 7, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(&tol, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (side = 0; side < 2; side++) {
        qk_states_array *s = side ? B : A;
        const size_t bytes = (size_t)(side ? hdr[4] : hdr[2]) * (size_t)hdr[1] * (size_t)((side ? hdr[5] : hdr[3]) ? hdr[1] : 1) *
                             (size_t)qk__state_esize((int)hdr[0]);
        size_t off;
        if (g_rank != 0) {
            s->type = (qk_state_type)hdr[0];
            s->dim = hdr[1];
            s->n = side ? hdr[4] : hdr[2];
            s->mixed = (int)(side ? hdr[5] : hdr[3]);
            s->data = bytes ? malloc(bytes) : NULL;
            bad = bytes && !s->data;
        }
        if (any(bad)) return fail(bad, QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %.3g GB of states", side ? "B" : "A", (double)bytes * 1e-9);
        for (off = 0; off < bytes; off += (size_t)1 << 30) {   /* MPI counts are int */
            size_t c = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
            MPI_Bcast((char *)s->data + off, (int)c, MPI_BYTE, 0, MPI_COMM_WORLD);
        }
    }
    if (g_rank != 0) {   /* the same desc (one type already: nothing converted here) */
        if (qkcli_states_desc(A, B, o->states, o->states_y, (int)hdr[6], tol, conv, st, msg, sizeof msg, &r)) return fail(1, r, "%s", msg);
    }
    return EXIT_SUCCESS;
}

/* --states read row by row (the default): every rank opens the .npy file(s) itself and reads
   only the rows qk asks it for (qk_states_desc.provider: the rows of its blocks of K), at
   data_off + row * (the file's bytes of a state), converted as qk-gram converts them (byte order,
   float16 / integers / bool, and the wider dtype of A and B); no rank holds all states. A
   Fortran-order file (no state's items are contiguous) and a pure side against a mixed one (a
   provider gives rows of one kind) are read by rank 0 and broadcast instead (read_bcast_states). */
typedef struct npy_src {
    int fd;                 /* -1: none */
    qk__npy_states f;       /* its header (io.c) */
    const char *path;
} npy_src;

typedef struct npy_prov {
    npy_src s[2];           /* A, B */
    qk_state_type to;       /* the one type of both sides */
    unsigned char *raw;     /* one state as the file holds it */
    int64_t rows[2], bytes[2];   /* read so far, per side (QK_GRAM_MPI_TEST_READS) */
    char err[1024];         /* the provider's failure, this rank's */
} npy_prov;

#define STATES_BROADCAST 2   /* open_states: read the states with read_bcast_states */

/* n bytes at byte off of fd (retrying EINTR and short reads); the count read (less at the end of
   the file), or -1 with errno set */
static int64_t pread_full(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)buf + got, n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30), off + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
    }
    return (int64_t)got;
}

/* qk_state_fn: rows [i0, i1) of side into buf (ld elements apart, of type p->to) */
static int npy_rows(int side, int64_t i0, int64_t i1, void *buf, int64_t ld, void *user) {
    npy_prov *p = (npy_prov *)user;
    npy_src *s = &p->s[side];
    const qk__npy_states *f = &s->f;
    const int64_t fb = f->row_items * f->size;   /* a state's bytes in the file */
    const int te = qk__state_esize(p->to);
    const int as_is = f->direct && p->to == f->type;
    int64_t i, k;
    if (s->fd < 0 || i0 < 0 || i1 > f->n || i1 <= i0) {
        snprintf(p->err, sizeof p->err, "%s rows [%lld, %lld) asked for, outside the file's %lld (internal error)", side ? "B" : "A",
                 (long long)i0, (long long)i1, (long long)f->n);
        return 1;
    }
    for (i = i0; i < i1; i++) {
        unsigned char *dst = (unsigned char *)buf + (size_t)((i - i0) * ld) * (size_t)te, *src = as_is ? dst : p->raw;
        const int64_t at = f->data_off + i * fb, got = pread_full(s->fd, src, (size_t)fb, (off_t)at);
        if (got != fb) {
            const int e = errno;
            snprintf(p->err, sizeof p->err, "%s '%s': cannot read state %lld (%lld bytes at byte %lld): %s", side ? "--states-y" : "--states",
                     qkcli_arg(s->path), (long long)i, (long long)fb, (long long)at,
                     got < 0 ? strerror(e) : "the file is shorter than its header says (truncated after it was checked?)");
            return 1;
        }
        p->rows[side]++;
        p->bytes[side] += got;
        if (as_is) continue;
        for (k = 0; k < f->row_items; k++) {   /* the item as qk_npy_read_states reads it, then widened as qkcli_convert_states */
            unsigned char item[16];
            if (p->to == f->type) qk__npy_state_item(src + k * f->size, f->kind, f->size, f->swap, f->type, dst + (size_t)k * (size_t)te);
            else {
                qk__npy_state_item(src + k * f->size, f->kind, f->size, f->swap, f->type, item);
                qkcli_convert_elem(item, f->type, 0, dst + (size_t)k * (size_t)te, p->to);
            }
        }
    }
    return 0;
}

/* what the ranks compare of a file's header */
static void head_info(const qk__npy_states *f, int64_t v[11]) {
    v[0] = f->n; v[1] = f->dim; v[2] = f->mixed; v[3] = (int64_t)f->type; v[4] = f->size; v[5] = f->kind; v[6] = f->swap;
    v[7] = f->data_off; v[8] = f->direct; v[9] = f->transposed; v[10] = f->row_items;
}

static void close_states(npy_prov *p) {
    int k;
    for (k = 0; k < 2; k++)
        if (p->s[k].fd >= 0) { close(p->s[k].fd); p->s[k].fd = -1; }
    free(p->raw);
    p->raw = NULL;
}

/* --states for the provider: rank 0 opens A (and B) and checks their headers (as qk-gram reads
   them: dtype, shape, a file size that matches); the ranks agree on what it found, then every
   other rank opens the files itself and must find the same headers (a rank that sees another
   file, or a shorter one, fails the job: every rank exits 1). A and B (their headers: n, dim,
   mixed; no data) and the desc with the provider in *st. Returns EXIT_SUCCESS, EXIT_FAILURE, or
   STATES_BROADCAST (a layout not read row by row: nothing is left open). */
static int open_states(const options *o, npy_prov *p, qk_states_array *A, qk_states_array *B, qk_states_desc *st) {
    const char *paths[2] = {o->states, o->states_y}, *opts[2] = {"--states", "--states-y"};
    char msg[1024];
    void *conv[2] = {NULL, NULL};
    int64_t info[2][11];
    int bad = 0, k, broadcast = 0, sides = o->states_y ? 2 : 1;
    qk_result r = QK_OK;
    memset(p, 0, sizeof *p);
    p->s[0].fd = p->s[1].fd = -1;
    memset(info, 0, sizeof info);
    for (k = 0; k < sides; k++) p->s[k].path = paths[k];
    if (g_rank == 0) {
        for (k = 0; k < sides && !bad; k++) {
            if (!qkcli_ends_with(paths[k], ".npy")) bad = fail(0, QK_OK, "%s '%s': states are read from a .npy file", opts[k], qkcli_arg(paths[k]));
            else if ((r = qk__npy_states_open(paths[k], &p->s[k].fd, &p->s[k].f)) != QK_OK) bad = fail(0, r, "cannot read %s (%s)", k ? "B" : "A", opts[k]);
            else if (qkcli_states_shape(opts[k], paths[k], p->s[k].f.n, p->s[k].f.dim, p->s[k].f.mixed, msg, sizeof msg)) bad = fail(0, QK_OK, "%s", msg);
        }
        broadcast = !bad && (p->s[0].f.transposed || (sides == 2 && (p->s[1].f.transposed || p->s[1].f.mixed != p->s[0].f.mixed)));
        if (getenv("QK_GRAM_MPI_TEST_BROADCAST")) broadcast = !bad;   /* tests: the read-and-broadcast path for any file */
    }
    if (any(bad)) { close_states(p); return EXIT_FAILURE; }
    MPI_Bcast(&broadcast, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (broadcast) { close_states(p); return STATES_BROADCAST; }
    if (g_rank == 0)   /* A and B as rank 0 found them */
        for (k = 0; k < sides; k++) head_info(&p->s[k].f, info[k]);
    MPI_Bcast(info, 22, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (g_rank != 0) {   /* each rank opens the files itself: they must be the ones rank 0 checked */
        for (k = 0; k < sides && !bad; k++) {
            const qk__npy_states *f = &p->s[k].f;
            int64_t v[11];
            if ((r = qk__npy_states_open(paths[k], &p->s[k].fd, &p->s[k].f)) != QK_OK) { bad = fail(1, r, "cannot read %s (%s)", k ? "B" : "A", opts[k]); break; }
            head_info(f, v);
            if (memcmp(v, info[k], sizeof v) != 0)
                bad = fail(1, QK_OK, "%s '%s': this rank sees a file unlike rank 0's (shape %s of %s here); every rank must see the same file",
                           opts[k], qkcli_arg(paths[k]), f->shp, f->dsc);
        }
    }
    if (any(bad)) { close_states(p); return EXIT_FAILURE; }
    /* the desc, from the headers (qkcli_states_desc: the same checks and type as qk-gram) */
    memset(A, 0, sizeof *A);
    memset(B, 0, sizeof *B);
    A->type = (qk_state_type)info[0][3]; A->n = info[0][0]; A->dim = info[0][1]; A->mixed = (int)info[0][2];
    if (sides == 2) { B->type = (qk_state_type)info[1][3]; B->n = info[1][0]; B->dim = info[1][1]; B->mixed = (int)info[1][2]; }
    if (qkcli_states_desc(A, B, o->states, o->states_y, o->normalize, o->norm_tol, conv, st, msg, sizeof msg, &r)) {
        close_states(p);
        return fail(0, r, "%s", msg);   /* every rank: the same headers, the same answer */
    }
    p->to = st->type;
    {
        size_t most = 0;
        for (k = 0; k < sides; k++)
            if ((size_t)(p->s[k].f.row_items * p->s[k].f.size) > most) most = (size_t)(p->s[k].f.row_items * p->s[k].f.size);
        p->raw = (unsigned char *)malloc(most);
        bad = !p->raw;
    }
    if (any(bad)) { close_states(p); return fail(bad, QK_ERROR_OUT_OF_MEMORY, "out of memory for a state's bytes"); }
    st->provider = npy_rows;
    st->provider_user = p;
    return EXIT_SUCCESS;
}

/* As qk-gram: the output must be a .npy in an existing, writable directory (rank 0 checks). */
static int check_output_path(const char *out) {
    struct stat st;
    char dir[4096];
    const char *slash = strrchr(out, '/');
    size_t dl = slash ? (slash == out ? 1 : (size_t)(slash - out)) : 1;
    if (!qkcli_ends_with(out, ".npy")) return fail(0, QK_OK, "--out '%s': the output must be a .npy file", out);
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) return fail(0, QK_OK, "--out '%s' is a directory", out);
    if (dl >= sizeof dir) return fail(0, QK_OK, "--out '%s': path too long", out);
    if (slash) memcpy(dir, out, dl);
    else dir[0] = '.';
    dir[dl] = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return fail(0, QK_OK, "--out '%s': directory '%s' does not exist", out, dir);
    if (access(dir, W_OK) != 0) return fail(0, QK_OK, "--out '%s': directory '%s' is not writable: %s", out, dir, strerror(errno));
    return EXIT_SUCCESS;
}

static void parse_args(int argc, char **argv, options *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->device = QK_DEVICE_CPU;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL, *eq, *err;
        char name[32];
        if ((err = qkcli_split(a, name, sizeof name, &eq)) != NULL) die_usage(err, qkcli_arg(a));
        if (!strcmp(name, "--help")) { if (g_rank == 0) fputs(usage_text, stdout); MPI_Finalize(); exit(0); }
        if (!strcmp(name, "--version")) { if (g_rank == 0) printf("qk-gram-mpi %s\n", QK_VERSION_STRING); MPI_Finalize(); exit(0); }
        if (!strcmp(name, "--quiet")) { o->quiet = 1; continue; }
        if (!strcmp(name, "--no-sync")) { o->no_sync = 1; continue; }
        if (!strcmp(name, "--autotune")) { o->autotune = 1; continue; }
        if (!strcmp(name, "--no-autotune")) { o->autotune = -1; continue; }
        if (!strcmp(name, "--normalize")) { o->normalize = 1; continue; }
        if (strcmp(name, "--map") && strcmp(name, "--x") && strcmp(name, "--y") && strcmp(name, "--out") &&
            strcmp(name, "--device") && strcmp(name, "--precision") && strcmp(name, "--weights") &&
            strcmp(name, "--threads") && strcmp(name, "--cache-dir") && strcmp(name, "--tol") &&
            strcmp(name, "--states") && strcmp(name, "--states-y") && strcmp(name, "--norm-tol"))
            die_usage("unknown option '%s'", qkcli_arg(name));
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else die_usage("option %s needs a value", name);
        if (!strcmp(name, "--map")) o->map = v;
        else if (!strcmp(name, "--x")) o->x = v;
        else if (!strcmp(name, "--y")) o->y = v;
        else if (!strcmp(name, "--out")) o->out = v;
        else if (!strcmp(name, "--weights")) o->weights = v;
        else if (!strcmp(name, "--cache-dir")) o->cache_dir = v;
        else if (!strcmp(name, "--states")) o->states = v;
        else if (!strcmp(name, "--states-y")) o->states_y = v;
        else if (!strcmp(name, "--norm-tol")) {
            if ((err = qkcli_norm_tol(v, &o->norm_tol)) != NULL) die_usage(err, qkcli_arg(v));
        } else if (!strcmp(name, "--device")) {
            if ((err = qkcli_device(v, &o->device)) != NULL) die_usage(err, qkcli_arg(v));
        } else if (!strcmp(name, "--precision")) {
            if ((err = qkcli_precision(v, &o->precision)) != NULL) die_usage(err, qkcli_arg(v));
        } else if (!strcmp(name, "--tol")) {
            if ((err = qkcli_tol(v, &o->tol)) != NULL) die_usage(err, qkcli_arg(v));
        } else {
            char *end;
            long t = strtol(v, &end, 10);
            if (*v == 0 || *end || t < 1 || t > 4096) die_usage("--threads '%s': expected a count from 1 to 4096", qkcli_arg(v));
            o->threads = (int)t;
        }
    }
    if (o->states || o->states_y) {   /* K from given states: no map, no samples */
        if (!o->states) die_usage("--states-y needs --states (the first set of states)");
        if (o->map) die_usage("--states and --map exclude each other: K comes from the given states, or from a map and samples");
        if (o->x || o->y) die_usage("--states and --%s exclude each other (a second set of states is --states-y)", o->x ? "x" : "y");
        if (o->weights) die_usage("--weights goes with --map, not --states");
    } else {
        if (o->normalize || o->norm_tol > 0.0) die_usage("%s goes with --states", o->normalize ? "--normalize" : "--norm-tol");
        if (!o->map) die_usage("--map is required (e.g. --map 'zz(reps=2)'), or --states");
        if (!o->x) die_usage("--x is required");
    }
    if (!o->out) die_usage("--out is required");
}

/* SIGINT / SIGTERM / SIGHUP: the progress callback cancels; qk_gram_mpi then stops every rank and
   removes the temporary file. */
static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int sig) { stop_signal = sig; }

typedef struct rank_clock { double t0, t_done; } rank_clock;

static int progress_cb(int64_t done, int64_t total, void *user) {
    rank_clock *c = (rank_clock *)user;
    if (done >= total && c->t_done == 0) c->t_done = qkcli_now();
    return stop_signal != 0;
}

static int run(const options *o) {
    qk_array X, Y, W;
    qk_states_array A, B;
    qk_states_desc st;
    npy_prov pv;
    void *conv[2] = {NULL, NULL};
    int64_t n_rows, n_cols;
    qk_map *map = NULL;
    qk_ctx *ctx = NULL;
    qk_ctx_desc cd;
    qk_gram_desc gd;
    qk_result r;
    MPI_Comm node;
    int node_rank = 0, node_size = 1, rc = EXIT_FAILURE, bad = 0, dev = -1, whole = 0;
    rank_clock clk;
    double secs, *t_all = NULL;
    struct sigaction sa, old_int, old_term, old_hup;

    memset(&X, 0, sizeof X);
    memset(&Y, 0, sizeof Y);
    memset(&W, 0, sizeof W);
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    memset(&pv, 0, sizeof pv);
    pv.s[0].fd = pv.s[1].fd = -1;
    if (any(g_rank == 0 && check_output_path(o->out) != EXIT_SUCCESS)) return EXIT_FAILURE;
    if (o->states) {   /* K from given states: checked by qk_gram_mpi_states on every rank */
        int how = open_states(o, &pv, &A, &B, &st);
        if (how == EXIT_FAILURE) goto done;
        if (how == STATES_BROADCAST && read_bcast_states(o, &A, &B, conv, &st) != EXIT_SUCCESS) goto done;
        whole = how == STATES_BROADCAST;
        if (A.mixed || B.mixed) {
            if (o->device == QK_DEVICE_CUDA) {
                fail(0, QK_OK, "--device cuda: density matrices run on the CPU engine (docs/states.md); use --device cpu or auto");
                goto done;
            }
        }
        n_rows = A.n;
        n_cols = o->states_y ? B.n : A.n;
        goto context;
    }
    if (read_bcast("X", o->x, 1, &X) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (o->y && read_bcast("Y", o->y, 1, &Y) != EXIT_SUCCESS) goto done;
    if (o->weights && read_bcast("--weights", o->weights, 0, &W) != EXIT_SUCCESS) goto done;
    if (o->y && Y.cols != X.cols) {
        fail(0, QK_OK, "feature count mismatch: X has %lld features, Y has %lld", (long long)X.cols, (long long)Y.cols);
        goto done;
    }
    if (X.cols > 0x7fffffff) { fail(0, QK_OK, "X has too many features"); goto done; }
    /* every rank parses the same spec: the same error everywhere, printed once */
    r = qk_map_parse(o->map, (int)X.cols, &map);
    if (r != QK_OK) { fail(0, r, "--map '%s'", qkcli_arg(o->map)); goto done; }
    if (o->weights) {
        r = W.rows * W.cols > 0x7fffffff ? QK_ERROR_INVALID_ARGUMENT : qk_map_set_weights(map, W.data, (int)(W.rows * W.cols));
        if (r != QK_OK) { fail(0, r, "--weights '%s' (the map has %d weights)", qkcli_arg(o->weights), map->n_weights); goto done; }
    }

    /* the data suits the map (every rank has the same data: the same answer everywhere) */
    r = qk_map_check_data(map, X.data, X.rows, "X");
    if (r != QK_OK) { fail(0, r, "bad data in '%s'", qkcli_arg(o->x)); goto done; }
    if (o->y && (r = qk_map_check_data(map, Y.data, Y.rows, "Y")) != QK_OK) { fail(0, r, "bad data in '%s'", qkcli_arg(o->y)); goto done; }

    n_rows = X.rows;
    n_cols = o->y ? Y.rows : X.rows;

context:
    /* the context: threads shared by the ranks of a node, GPU by node-local rank */
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    memset(&cd, 0, sizeof cd);
    cd.device = o->device;
    if (A.mixed || B.mixed) cd.device = QK_DEVICE_CPU;   /* auto: the CPU engine, the one that takes them */
    cd.n_threads = o->threads;
    if (!cd.n_threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        cd.n_threads = nc / node_size > 1 ? (int)(nc / node_size) : 1;
    }
    cd.autotune = o->autotune;
    cd.cache_dir = o->cache_dir;
#if defined(QK_CUDA) && QK_CUDA
    if (o->device != QK_DEVICE_CPU) {
        int n = qk_cuda_device_count();
        if (n > 0) {
            /* exactly this GPU (a context's default is every visible GPU) */
            cd.cuda_device = dev = node_rank % n;
            cd.n_cuda_devices = 1;
        }
    }
#endif
    r = qk_ctx_create(&cd, &ctx);
    bad = r != QK_OK;
    if (bad) fail(1, r, "cannot create the qk context");
    if (any(bad)) goto done;

    memset(&gd, 0, sizeof gd);
    gd.x = o->states ? NULL : X.data;
    gd.n_x = o->states ? 0 : X.rows;
    gd.y = o->y ? Y.data : NULL;
    gd.n_y = o->y ? Y.rows : 0;
    gd.precision = o->precision;
    gd.tol = o->tol;
    /* the output dtype, made explicit for the summary line: float32 for fp32 and the tensor-core
       modes, and for auto / the default on the GPU */
    gd.out_dtype = (o->precision != QK_PRECISION_DEFAULT && o->precision != QK_PRECISION_AUTO && o->precision != QK_PRECISION_FP64) ||
                   ((o->precision == QK_PRECISION_DEFAULT || o->precision == QK_PRECISION_AUTO) && qk_ctx_query(ctx).device == QK_DEVICE_CUDA)
                   ? QK_F32 : QK_F64;
    gd.output = QK_OUTPUT_NPY;
    gd.out_path = o->out;
    gd.no_sync = o->no_sync;
    gd.progress = progress_cb;
    gd.progress_user = &clk;
    if (!o->quiet && g_rank == 0 && o->states) {
        printf("data: A %s (%lld %s of dim %lld, %s)", qkcli_arg(o->states), (long long)A.n, A.mixed ? "density matrices" : "states",
               (long long)A.dim, qkcli_state_type_name(st.type));
        if (o->states_y)
            printf(", B %s (%lld %s, %s)\n", qkcli_arg(o->states_y), (long long)B.n, B.mixed ? "density matrices" : "states",
                   qkcli_state_type_name(st.type));
        else printf(", K = K(A, A) (symmetric)\n");
    } else if (!o->quiet && g_rank == 0) {
        char spec[512];
        qk_map_spec(map, spec, sizeof spec);
        printf("map:  %s  (%d qubits, %d features, %s)\n", spec, map->n_qubits, map->n_features, qk_map_class_string(map->cls));
        printf("data: X %s (%lld x %lld)%s%s%s\n", qkcli_arg(o->x), (long long)X.rows, (long long)X.cols, o->y ? ", Y " : "",
               o->y ? qkcli_arg(o->y) : "", o->y ? "" : ", K = K(X, X) (symmetric)");
    }
    if (!o->quiet && g_rank == 0) {
        printf("ranks: %d, %s engine, %d threads per rank\n", g_size,
               qk_ctx_query(ctx).device == QK_DEVICE_CUDA ? "CUDA" : "CPU", qk_ctx_query(ctx).n_threads);
        fflush(stdout);
    }

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    MPI_Barrier(MPI_COMM_WORLD);
    memset(&clk, 0, sizeof clk);
    clk.t0 = qkcli_now();
    r = o->states ? qk_gram_mpi_states(ctx, &st, &gd, MPI_COMM_WORLD) : qk_gram_mpi(ctx, map, &gd, MPI_COMM_WORLD);
    secs = qkcli_now() - clk.t0;
    if (r != QK_OK && pv.err[0]) fail(1, QK_OK, "%s", pv.err);   /* this rank's provider: what it could not read */
    if (o->states && getenv("QK_GRAM_MPI_TEST_READS")) {   /* tests: what each rank read of the state files */
        fprintf(stderr, "qk-gram-mpi: test reads: rank %d of %d: %s, A %lld rows %lld bytes, B %lld rows %lld bytes\n", g_rank, g_size,
                whole ? "broadcast" : "rows", (long long)pv.rows[0], (long long)pv.bytes[0], (long long)pv.rows[1], (long long)pv.bytes[1]);
        fflush(stderr);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    {
        int sig = stop_signal, any_sig = 0;
        MPI_Allreduce(&sig, &any_sig, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (r == QK_ERROR_CANCELLED && any_sig) {
            if (g_rank == 0) fprintf(stderr, "qk-gram-mpi: stopped by %s; '%s' was not written\n",
                                    any_sig == SIGINT ? "SIGINT" : any_sig == SIGHUP ? "SIGHUP" : "SIGTERM", qkcli_arg(o->out));
            rc = 128 + any_sig;
            goto done;
        }
    }
    if (r != QK_OK) { fail(0, r, "Gram failed"); goto done; }

    /* when each rank finished its band: the balance of the split */
    if (g_rank == 0) t_all = (double *)malloc(sizeof(double) * 2 * (size_t)g_size);
    {
        double mine[2];
        mine[0] = clk.t_done > 0 ? clk.t_done - clk.t0 : secs;
        mine[1] = (double)dev;
        MPI_Gather(mine, 2, MPI_DOUBLE, t_all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    if (!o->quiet && g_rank == 0 && t_all) {
        int64_t cols = n_cols;
        double mean = 0, mx = 0;
        int k;
        for (k = 0; k < g_size; k++) {
            mean += t_all[2 * k] / g_size;
            if (t_all[2 * k] > mx) mx = t_all[2 * k];
        }
        printf("ranks' bands done after (s):");
        for (k = 0; k < g_size; k++) printf(" %.3f", t_all[2 * k]);
        printf("  (slowest / mean %.3f)\n", mean > 0 ? mx / mean : 1.0);
        printf("done: K %lld x %lld (%s) -> %s; %lld pairs%s in %.3f s on %d ranks, %.3g Gpairs/s\n", (long long)n_rows,
               (long long)cols, gd.out_dtype == QK_F32 ? "float32" : "float64",
               qkcli_arg(o->out), (long long)(n_rows * cols), o->y || o->states_y ? "" : " (i <= j computed, mirrored)", secs, g_size,
               secs > 0 ? (double)(n_rows * cols) / secs * 1e-9 : 0.0);
    }
    rc = EXIT_SUCCESS;
done:
    free(t_all);
    qk_ctx_destroy(ctx);
    qk_map_free(map);
    qk_array_free(&X);
    qk_array_free(&Y);
    qk_array_free(&W);
    if (conv[0]) { free(conv[0]); A.data = NULL; }
    if (conv[1]) { free(conv[1]); B.data = NULL; }
    qk_states_array_free(&A);
    qk_states_array_free(&B);
    close_states(&pv);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int rc, provided = 0;
    /* SIGXFSZ caught (options.h): a write past ulimit -f fails with EFBIG and qk_gram_mpi fails on
       every rank, removing the file; the rank that hit the limit says so. Before MPI_Init: it
       creates its shared-memory backing files under the same limit. */
    qkcli_catch_fsize();
    /* SERIALIZED: qk_gram_mpi writes each slab from a second thread while the next is computed */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (argc == 1) {
        if (g_rank == 0) fputs(usage_text, stderr);
        MPI_Finalize();
        return EXIT_USAGE;
    }
    parse_args(argc, argv, &o);
    rc = run(&o);
    if (rc == EXIT_FAILURE && qkcli_fsize_hit) {
        char note[256];
        qkcli_fsize_note(note, sizeof note);
        fail(1, QK_OK, "%s", note);
    }
    MPI_Finalize();
    return rc;
}
