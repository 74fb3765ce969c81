/* qk-gram — quantum-kernel Gram matrices from the command line.

     qk-gram --map SPEC --x X.npy [--y Y.npy] --out K.npy [options]
     qk-gram --states A.npy [--states-y B.npy] --out K.npy [options]
     qk-gram --projected [--gamma G] --map SPEC --x X.npy [--y Y.npy] --out K.npy [options]
     qk-gram --demo

   Reads X (and Y) from .npy or .csv, computes K = K(X, X) or K(X, Y) with qk, and writes K as a
   .npy file atomically (all or nothing). --states takes the states themselves (a simulator's
   statevectors or density matrices) instead of samples and a map (qk_gram_states). --projected
   computes the projected quantum kernel instead of the fidelity kernel (qk_gram_projected). --demo trains a quantum-kernel classifier on the Iris
   data shipped in examples/data and prints its test accuracy. docs/cli.md has the details.

   Exit status: 0 success, 1 error (bad input, I/O, computation), 2 bad command line, 130 / 143 / 129
   stopped by SIGINT / SIGTERM / SIGHUP. */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime, isatty, access under strict -std=c11 */
#define _XOPEN_SOURCE 700         /* realpath */
#define QK_IMPLEMENTATION
#define QK_PROF_IMPLEMENTATION    /* with -DQK_PROF_ENABLE: the profiler's implementation, here (qk.h's rule) */
#include "qk.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "options.h"   /* what qk-gram and qk-gram-mpi share */

#ifndef QK_DEMO_DATA
#define QK_DEMO_DATA "examples/data"
#endif

#define EXIT_USAGE 2
#define DEMO_PI 3.14159265358979323846

static const char *usage_text =
    "usage: qk-gram --map SPEC --x X.npy [--y Y.npy] --out K.npy [options]\n"
    "       qk-gram --states A.npy [--states-y B.npy] --out K.npy [options]\n"
    "       qk-gram --projected [--gamma G] --map SPEC --x X.npy [--y Y.npy] --out K.npy\n"
    "       qk-gram --demo [--data DIR] [--map SPEC] [--device D] [--threads N]\n"
    "\n"
    "Computes the quantum-kernel Gram matrix K[i][j] = |<psi(x_i)|psi(y_j)>|^2 of the rows of X\n"
    "(and Y) under a feature map and writes it as a .npy file.\n"
    "\n"
    "  --map SPEC        feature map: zz(reps=2,ent=full), iqp, angle(rot=y), amplitude, basis,\n"
    "                    hea(layers=2), circuit(...); see docs/maps.md (default for --demo:\n"
    "                    zz(reps=2,alpha=0.5))\n"
    "  --x FILE          samples, one per row: .npy (2-D; float, int or bool, C or Fortran order)\n"
    "                    or .csv (numbers, optional header line)\n"
    "  --y FILE          second sample set: K = K(X, Y) of shape n_x x n_y (default K(X, X))\n"
    "  --states FILE     instead of --map and --x: the states themselves, a .npy of shape\n"
    "                    (n, dim) (complex128, complex64, float64, float32 statevectors) or\n"
    "                    (n, dim, dim) (density matrices: K = Tr(rho_i rho_j)); docs/states.md\n"
    "  --states-y FILE   second set of states: K = K(A, B) (default K(A, A))\n"
    "  --projected       the projected quantum kernel (Huang et al. 2021) instead of the\n"
    "                    fidelity: K = exp(-gamma sum_k ||rho_k(x) - rho_k(y)||_F^2) over the\n"
    "                    one-qubit reduced density matrices, in fp64 on the CPU or GPU engine\n"
    "                    (--device; one GPU), the statevector or MPS path (--path; MPS beyond 30\n"
    "                    qubits), product maps at any qubit count; docs/cli.md\n"
    "  --gamma G         --projected: the bandwidth gamma > 0 (default 1)\n"
    "  --normalize       --states: scale each state to norm 1 (each matrix to trace 1)\n"
    "  --norm-tol T      --states: accepted |<a|a> - 1| (default 1e-9; float32/complex64: 1e-5)\n"
    "  --out FILE        output .npy; written to a temporary file and renamed, so it is\n"
    "                    either complete or absent\n"
    "  --device D        auto (default: CUDA when present, else CPU), cpu, cuda\n"
    "  --gpus LIST       CUDA devices to use: all (default: every visible GPU; a job of at\n"
    "                    least 2^25 pairs per GPU is dealt to them), or ordinals such as 0,1;\n"
    "                    one ordinal runs on that GPU alone (docs/cli.md); --projected: one\n"
    "                    ordinal or all (the first)\n"
    "  --precision P     fp32 or fp64 (the output dtype follows: float32 / float64), or the\n"
    "                    GPU's tensor-core modes fp32x3 (fp32 accuracy), tf32, fp16 (~1e-3;\n"
    "                    docs/precision.md), or auto: the fastest mode whose stated error bound\n"
    "                    meets --tol; default: fp64 on the CPU engine, auto on the GPU engine\n"
    "                    (fp32 unless --tol says otherwise); the CPU engine computes in fp64\n"
    "                    whatever is asked; the plan says which mode and why\n"
    "  --tol T           largest acceptable error bound of K for --precision auto (default:\n"
    "                    fp32's bound at the map's qubit count, so the GPU keeps fp32)\n"
    "  --path P          auto (default), mps (matrix product states, local maps, any qubit\n"
    "                    count: docs/mps.md) or statevector\n"
    "  --weights FILE    trainable weights of the map (.npy or .csv, all values in order)\n"
    "  --threads N       CPU engine threads (default: all cores)\n"
    "  --quiet           print errors only\n"
    "  --progress        progress lines on stderr every 5 s (for logs; a terminal gets a bar)\n"
    "  --no-sync         do not fsync K.npy (faster on slow disks; K may be lost in a crash)\n"
    "  --autotune        GPU: time the kernel configurations now and store the best in the cache\n"
    "  --no-autotune     GPU: use the fixed per-architecture table (default: the cached choice,\n"
    "                    tuned on a miss; docs/autotune.md)\n"
    "  --cache-dir DIR   autotune cache directory (default $QK_CACHE_DIR, $XDG_CACHE_HOME/qk,\n"
    "                    ~/.cache/qk)\n"
    "  --profile FILE    profiler report (text tables; \"-\" = stdout) of qk's pipeline\n"
    "  --trace FILE      Chrome trace-event JSON (Perfetto, chrome://tracing)\n"
    "  --html FILE       self-contained HTML profiler report\n"
    "  --demo            Iris demo: zz kernel + kernel ridge classifier, prints test accuracy\n"
    "  --data DIR        directory holding iris.csv for --demo\n"
    "  --help, --version\n"
    "\n"
    "Exit status: 0 success, 1 error (bad input, I/O, computation), 2 bad command line,\n"
    "130 / 143 / 129 stopped by SIGINT / SIGTERM / SIGHUP (the old output, if any, is left as it was).\n";

typedef struct options {
    const char *map, *x, *y, *out, *weights, *data;
    const char *states, *states_y;        /* --states, --states-y: K from given states */
    int normalize;                        /* --normalize */
    int projected;                        /* --projected: qk_gram_projected */
    double gamma;                         /* --gamma (0: the default, 1) */
    double norm_tol;                      /* --norm-tol (0: the library's default) */
    const char *profile, *trace, *html;   /* profiler outputs (builds with QK_PROF_ENABLE) */
    const char *cache_dir;                /* autotune cache directory */
    int autotune;                         /* 0 cache, 1 --autotune, -1 --no-autotune */
    qk_device device;
    qk_precision precision;
    double tol;                           /* --tol (0: the default) */
    qk_path path;                         /* --path: DEFAULT (auto), MPS, COMPLEX (statevector) */
    int threads, quiet, demo, progress, no_sync;
    int gpus[QK_MAX_DEVICES], n_gpus;     /* --gpus: ordinals (n_gpus 0: all, the default) */
} options;

/* Where messages go: stdout / stderr, or nowhere (the fuzz targets in tests/ set quiet_msgs). */
static int quiet_msgs = 0;


static void put_msgf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    qkcli_put_msg(fmt, ap);
    va_end(ap);
}

/* Prints "qk-gram: <message>" and the --help hint; returns EXIT_USAGE. */
static int usage_error(const char *fmt, ...) {
    va_list ap;
    if (quiet_msgs) return EXIT_USAGE;
    fprintf(stderr, "qk-gram: ");
    va_start(ap, fmt);
    qkcli_put_msg(fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(qk-gram --help shows the options)\n");
    return EXIT_USAGE;
}

/* usage_error, then exit (demo_main's check; parse_args and check_args never exit). */
static void die_usage(const char *fmt, const char *arg) {
    exit(usage_error(fmt, arg));
}

/* Prints "qk-gram: error: <what>: <qk detail>" and returns EXIT_FAILURE. */
static int fail(qk_result r, const char *fmt, ...) {
    va_list ap;
    const char *detail = qk_last_error();
    if (quiet_msgs) return EXIT_FAILURE;
    fprintf(stderr, "qk-gram: error: ");
    va_start(ap, fmt);
    qkcli_put_msg(fmt, ap);
    va_end(ap);
    if (r != QK_OK) put_msgf(": %s", detail && *detail ? detail : qk_result_string(r));
    fprintf(stderr, "\n");
    return EXIT_FAILURE;
}

static int prof_fail(const char *what, const char *path) {
#ifdef QK_PROF_ENABLE
    put_msgf("qk-gram: error: cannot write the %s '%s': %s\n", what, qkcli_arg(path), qk_prof_last_error());
#else
    put_msgf("qk-gram: error: cannot write the %s '%s'\n", what, qkcli_arg(path));
#endif
    return EXIT_FAILURE;
}

/* The parser's detail says "column N" (1-based): show the spec with a caret under it (not for a
   spec with control or non-ASCII bytes: the message has it escaped, the caret would not align;
   nor for one longer than the message quotes, QK__ESC_ARG_MAX bytes). */
static void show_spec_column(const char *spec) {
    const char *c = strstr(qk_last_error(), "column "), *p;
    int col;
    if (strlen(spec) > QK__ESC_ARG_MAX) return;
    for (p = spec; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) return;
    if (quiet_msgs || !c || sscanf(c + 7, "%d", &col) != 1 || col < 1 || col > (int)strlen(spec) + 1) return;
    fprintf(stderr, "    %s\n    %*s^\n", spec, col - 1, "");
}



static int known_type(const char *path) { return qkcli_ends_with(path, ".npy") || qkcli_ends_with(path, ".csv"); }

/* .npy or .csv by extension (known_type checked first). */
static qk_result read_array(const char *path, qk_array *a) {
    return qkcli_ends_with(path, ".npy") ? qk_npy_read(path, a) : qk_csv_read(path, a);
}

/* Reads a 2-D sample matrix; prints the error itself. */
static int read_samples(const char *what, const char *path, qk_array *a) {
    qk_result r;
    long long rows, cols;
    if (!known_type(path)) return fail(QK_OK, "%s: '%s' is neither .npy nor .csv", what, qkcli_arg(path));
    r = read_array(path, a);
    if (r != QK_OK) return fail(r, "cannot read %s", what);
    /* The shape is taken before qk_array_free zeroes it (the message used to say (0,)). */
    rows = (long long)a->rows;
    cols = (long long)a->cols;
    if (a->ndim != 2) {
        qk_array_free(a);
        return fail(QK_OK, "%s: '%s' is 1-D (shape (%lld,)); samples must be 2-D (n_samples, n_features) "
                    "(for one feature, save x.reshape(-1, 1))", what, qkcli_arg(path), rows);
    }
    if (rows < 1 || cols < 1) {
        qk_array_free(a);
        return fail(QK_OK, "%s: '%s' has shape (%lld, %lld); it needs at least one sample and one feature",
                    what, qkcli_arg(path), rows, cols);
    }
    return EXIT_SUCCESS;
}

/* Reads --weights into the map (all values of the file in row-major order; their count must be
   the map's); without --weights, notes that every weight is 1.0. Prints the error itself. */
static int read_weights(const char *path, qk_map *map, int quiet) {
    qk_array W;
    qk_result r;
    int64_t n;
    if (!path) {
        if (map->n_weights > 0 && !quiet && !quiet_msgs)
            printf("note: the map has %d trainable weights; none given (--weights), so all are 1.0\n", map->n_weights);
        return EXIT_SUCCESS;
    }
    memset(&W, 0, sizeof W);
    if (!known_type(path)) return fail(QK_OK, "--weights '%s' is neither .npy nor .csv", qkcli_arg(path));
    r = read_array(path, &W);
    if (r != QK_OK) return fail(r, "cannot read --weights");
    n = W.rows * W.cols;
    if (n != map->n_weights) {
        fail(QK_OK, "--weights '%s' holds %lld values, the map has %d weights", qkcli_arg(path), (long long)n, map->n_weights);
        qk_array_free(&W);
        return EXIT_FAILURE;
    }
    r = qk_map_set_weights(map, W.data, (int)n);
    qk_array_free(&W);
    if (r != QK_OK) return fail(r, "--weights '%s'", qkcli_arg(path));
    return EXIT_SUCCESS;
}

/* Checks before any work that the output can be written: a failing run should fail in the
   first millisecond, not after an hour of computation. qk_npy_write checks again, for real. */
static int check_output_path(const char *out) {
    struct stat st;
    char dir[4096];
    const char *slash = strrchr(out, '/');
    size_t dl = slash ? (slash == out ? 1 : (size_t)(slash - out)) : 1;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) return fail(QK_OK, "--out '%s' is a directory", out);
    if (dl >= sizeof dir) return fail(QK_OK, "--out '%s': path too long", out);
    if (slash) memcpy(dir, out, dl);
    else dir[0] = '.';
    dir[dl] = 0;
    if (stat(dir, &st) != 0) return fail(QK_OK, "--out '%s': directory '%s' does not exist", out, dir);
    if (!S_ISDIR(st.st_mode)) return fail(QK_OK, "--out '%s': '%s' is not a directory", out, dir);
    if (access(dir, W_OK) != 0)
        return fail(QK_OK, "--out '%s': directory '%s' is not writable: %s", out, dir, strerror(errno));
    return EXIT_SUCCESS;
}

/* The profiler's outputs (--profile, --trace, --html) are checked before any work as --out is,
   so that a bad one fails the run before K is computed and written: an existing writable
   directory, a name that is no directory (nor a device or FIFO: "-" is standard output). */
static int check_prof_output(const char *opt, const char *path) {
    struct stat st;
    char dir[4096];
    const char *slash;
    size_t n, dl;
    if (!path || strcmp(path, "-") == 0) return EXIT_SUCCESS;
    n = strlen(path);
    if (n == 0) return fail(QK_OK, "%s: the file name is empty", opt);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return fail(QK_OK, "%s '%s' is a directory: name a file in it", opt, path);
    if (path[n - 1] == '/') return fail(QK_OK, "%s '%s' ends with '/': name a file, not a directory", opt, path);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return fail(QK_OK, "%s '%s' exists and is not a regular file (\"-\" is standard output)", opt, path);
    slash = strrchr(path, '/');
    dl = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    if (dl >= sizeof dir) return fail(QK_OK, "%s '%s': path too long", opt, path);
    if (slash) memcpy(dir, path, dl);
    else dir[0] = '.';
    dir[dl] = 0;
    if (stat(dir, &st) != 0) return fail(QK_OK, "%s '%s': directory '%s' does not exist", opt, path, dir);
    if (!S_ISDIR(st.st_mode)) return fail(QK_OK, "%s '%s': '%s' is not a directory", opt, path, dir);
    if (access(dir, W_OK) != 0)
        return fail(QK_OK, "%s '%s': directory '%s' is not writable: %s", opt, path, dir, strerror(errno));
    return EXIT_SUCCESS;
}

static int check_prof_outputs(const options *o) {
    if (check_prof_output("--profile", o->profile) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (check_prof_output("--trace", o->trace) != EXIT_SUCCESS) return EXIT_FAILURE;
    return check_prof_output("--html", o->html);
}

/* --out, then the profiler's outputs */
static int check_outputs(const options *o) {
    if (check_output_path(o->out) != EXIT_SUCCESS) return EXIT_FAILURE;
    return check_prof_outputs(o);
}

/* ---- progress bar ---- */
/* Progress on stderr. On a terminal: a bar with pairs/s, GB written and the time left, redrawn
   every 0.1 s once the job has run 0.5 s (short jobs print nothing). --progress (or stderr not
   a terminal with --progress): one line every 5 s, for logs. The time left is shown once 1 s
   and 1% of the work have passed since the first pairs were done (start-up, planning and the
   state construction are not a rate), so the first estimate is not a wild guess. The engine
   may call back from several threads: a try-lock skips concurrent draws. */
typedef struct progress {
    int mode;                   /* 0 off, 1 terminal bar, 2 log lines */
    double t0, last, t_first;
    int64_t done_first;
    double bytes_per_pair;
    int drawn;
    atomic_flag busy;
} progress;

/* SIGINT / SIGTERM / SIGHUP: the handler only records the signal; the progress callback then cancels the
   Gram, qk removes its temporary output file, and main exits 128 + signal. While stop_exits is
   set (--states: reading and converting the states, before any output exists) there is nothing
   to clean up, and the handler writes its note (stop_note) and exits 128 + signal at once. */
static volatile sig_atomic_t stop_signal = 0;
static volatile sig_atomic_t stop_exits = 0;
static char stop_note[3][600];   /* SIGINT, SIGTERM, SIGHUP */
static size_t stop_note_len[3];
static void on_stop_signal(int sig) {
    if (stop_exits) {   /* write and _exit only: async-signal-safe */
        const int k = sig == SIGINT ? 0 : sig == SIGTERM ? 1 : 2;
        if (write(2, stop_note[k], stop_note_len[k]) < 0) {}
        _exit(128 + sig);
    }
    stop_signal = sig;
}
static const char *stop_what(int sig) {
    return sig == SIGINT ? "interrupted (SIGINT)" : sig == SIGHUP ? "hung up (SIGHUP)" : "terminated (SIGTERM)";
}
static const int stop_sigs[3] = {SIGINT, SIGTERM, SIGHUP};
/* on_stop_signal for the three signals; old[3] receives the handlers it replaces (stop_restore) */
static void stop_install(struct sigaction old[3]) {
    struct sigaction sa;
    int k;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (k = 0; k < 3; k++) sigaction(stop_sigs[k], &sa, &old[k]);
}
static void stop_restore(const struct sigaction old[3]) {
    int k;
    for (k = 0; k < 3; k++) sigaction(stop_sigs[k], &old[k], NULL);
}
/* stop_note: the line run_gram prints for a stop, for the handler to write when it exits at once */
static void stop_notes(const char *out) {
    int k;
    for (k = 0; k < 3; k++) {
        snprintf(stop_note[k], sizeof stop_note[k], "qk-gram: %s: stopped; '%s' was not written\n", stop_what(stop_sigs[k]),
                 qkcli_arg(out));
        stop_note_len[k] = strlen(stop_note[k]);
    }
}

static int progress_cb(int64_t done, int64_t total, void *user) {
    progress *p = (progress *)user;
    double t, frac, rate, el;
    char eta[32];
    int i, w = 30, fill;
    if (stop_signal) return 1;
    if (p->mode == 0 || atomic_flag_test_and_set(&p->busy)) return 0;
    t = qkcli_now();
    if (done > 0 && p->t_first == 0) { p->t_first = t; p->done_first = done; }
    el = t - p->t0;
    if ((p->mode == 1 && el > 0.5 && t - p->last > 0.1) || (p->mode == 2 && t - p->last >= 5.0) || (done >= total && (p->drawn || p->mode == 2))) {
        frac = total > 0 ? (double)done / (double)total : 1.0;
        rate = p->t_first > 0 && t > p->t_first ? (double)(done - p->done_first) / (t - p->t_first) : 0.0;
        if (done >= total) snprintf(eta, sizeof eta, "done");
        else if (rate > 0 && t - p->t_first >= 1.0 && frac >= 0.01)
            snprintf(eta, sizeof eta, "%.0f s left", (double)(total - done) / rate);
        else snprintf(eta, sizeof eta, "estimating");
        if (p->mode == 1) {
            fill = (int)(frac * w + 0.5);
            fprintf(stderr, "\r[");
            for (i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
            fprintf(stderr, "] %5.1f%%  %.3g Gpairs/s  %.2f GB  %.1f s, %s   ", 100.0 * frac, rate * 1e-9,
                    (double)done * p->bytes_per_pair * 1e-9, el, eta);
        } else {
            fprintf(stderr, "qk-gram: progress %.1f%%, %lld of %lld pairs, %.3g Gpairs/s, %.2f GB, %.1f s, %s\n", 100.0 * frac,
                    (long long)done, (long long)total, rate * 1e-9, (double)done * p->bytes_per_pair * 1e-9, el, eta);
        }
        fflush(stderr);
        p->last = t;
        p->drawn = 1;
    }
    atomic_flag_clear(&p->busy);
    return 0;
}

static void progress_end(progress *p) {
    if (p->drawn && p->mode == 1) fprintf(stderr, "\n");
}

/* The plan of the job (st: given states, qk_plan_states; else the map's, qk_plan_make) on
   standard output, and into *plan_out. */
static void print_plan(qk_ctx *ctx, const qk_map *map, const qk_states_desc *st, const qk_gram_desc *gd, qk_plan *plan_out,
                       int quiet) {
    qk_plan plan;
    char spec[512];
    int n;
    char *buf;
    memset(&plan, 0, sizeof plan);
    if ((st ? qk_plan_states(ctx, st, gd, &plan) : qk_plan_make(ctx, map, gd, &plan)) != QK_OK) {
        if (!quiet) fprintf(stderr, "qk-gram: note: no plan: %s\n", qk_last_error());
        if (plan_out) memset(plan_out, 0, sizeof *plan_out);
        return;
    }
    if (plan_out) *plan_out = plan;
    if (quiet) return;
    if (map) {
        qk_map_spec(map, spec, sizeof spec);
        printf("map:  %s  (%d qubits, %d features, %s)\n", spec, map->n_qubits, map->n_features,
               qk_map_class_string(map->cls));
    }
    n = qk_plan_describe(&plan, NULL, 0);
    buf = (char *)malloc((size_t)(n > 0 ? n : 0) + 1);
    if (buf) {
        qk_plan_describe(&plan, buf, (size_t)n + 1);
        printf("%s%s", buf, n > 0 && buf[n - 1] == '\n' ? "" : "\n");
        free(buf);
    }
}

/* Runs one Gram streamed into the .npy file `path` (qk writes a temporary file next to it and
   renames it when K is complete; K is never whole in memory); prints errors. SIGINT / SIGTERM / SIGHUP
   during the run cancel it: the temporary file is removed and the old `path` stays. */
static int run_gram(qk_ctx *ctx, const qk_map *map, const qk_states_desc *st, qk_gram_desc *gd, const options *o,
                    qk_dtype *dtype, double *seconds) {
    qk_plan plan;
    progress prog;
    double t0;
    qk_result r;
    struct sigaction old_sa[3];

    gd->output = QK_OUTPUT_NPY;
    gd->out_path = o->out;
    gd->no_sync = o->no_sync;
    print_plan(ctx, map, st, gd, &plan, o->quiet);
    if (gd->out_dtype == QK_DTYPE_DEFAULT)
        gd->out_dtype = plan.out_dtype != QK_DTYPE_DEFAULT ? plan.out_dtype
                      : gd->precision == QK_PRECISION_FP32 ? QK_F32 : QK_F64;

    memset(&prog, 0, sizeof prog);
    atomic_flag_clear(&prog.busy);
    prog.mode = o->quiet ? 0 : o->progress ? 2 : isatty(2) ? 1 : 0;
    if (o->progress && isatty(2) && !o->quiet) prog.mode = 1;
    prog.t0 = qkcli_now();
    prog.bytes_per_pair = gd->out_dtype == QK_F32 ? 4.0 : 8.0;
    gd->progress = progress_cb;
    gd->progress_user = &prog;

    stop_install(old_sa);
    t0 = qkcli_now();
    stop_exits = 0;   /* from here qk may have output to remove: a stop waits for the run's next poll */
    r = st ? qk_gram_states(ctx, st, gd) : qk_gram(ctx, map, gd);
    *seconds = qkcli_now() - t0;
    stop_restore(old_sa);
    progress_end(&prog);
    if (r == QK_ERROR_CANCELLED && stop_signal) {
        fprintf(stderr, "qk-gram: %s: stopped; '%s' was not written\n", stop_what(stop_signal), qkcli_arg(o->out));
        return 128 + (int)stop_signal;
    }
    if (r != QK_OK && st && (r == QK_ERROR_NON_FINITE || r == QK_ERROR_BAD_DATA || r == QK_ERROR_ZERO_NORM)) {
        /* the detail names the side and the row (A[3]: ...): the file too */
        const int b = strncmp(qk_last_error(), "B[", 2) == 0;
        return fail(r, "bad states in '%s' (%s)", qkcli_arg(b ? o->states_y : o->states), b ? "--states-y" : "--states");
    }
    if (r != QK_OK) return fail(r, "Gram failed");
    *dtype = gd->out_dtype;
    return EXIT_SUCCESS;
}

/* ---- command line ---- */
/* parse_args and check_args never exit: they return -1 to go on, or the exit status to end with
   (0 after --help / --version, EXIT_USAGE for a bad command line, the message printed), so
   that tests/fuzz/fuzz_qk_gram_args.c can call them. */

/* Options that take a value; given twice is an error (a second --x meant as --y would silently
   compute another K). */
static const char *const value_options[] = {"--map", "--x", "--y", "--out", "--device", "--precision", "--weights",
                                            "--threads", "--data", "--profile", "--trace", "--html", "--cache-dir", "--path", "--tol",
                                            "--gpus", "--states", "--states-y", "--norm-tol", "--gamma"};
enum { N_VALUE_OPTIONS = (int)(sizeof value_options / sizeof value_options[0]) };

static int parse_args(int argc, char **argv, options *o) {
    int i, k, seen[N_VALUE_OPTIONS];
    memset(o, 0, sizeof *o);
    memset(seen, 0, sizeof seen);
    for (i = 1; i < argc; i++) {
        const char *a = strcmp(argv[i], "-h") == 0 ? "--help" : argv[i], *v = NULL, *eq, *err;
        char name[32];
        if ((err = qkcli_split(a, name, sizeof name, &eq)) != NULL) return usage_error(err, qkcli_arg(a));
        if (strcmp(name, "--help") == 0) {
            if (!quiet_msgs) fputs(usage_text, stdout);
            return 0;
        }
        if (strcmp(name, "--version") == 0) {
            if (!quiet_msgs) printf("qk-gram %s\n", QK_VERSION_STRING);
            return 0;
        }
        for (k = 0; k < N_VALUE_OPTIONS && strcmp(name, value_options[k]) != 0; k++) {}
        if (k == N_VALUE_OPTIONS) {
            if (eq) return usage_error("option %s takes no value", name);
            if (strcmp(name, "--quiet") == 0) o->quiet = 1;
            else if (strcmp(name, "--demo") == 0) o->demo = 1;
            else if (strcmp(name, "--progress") == 0) o->progress = 1;
            else if (strcmp(name, "--no-sync") == 0) o->no_sync = 1;
            else if (strcmp(name, "--autotune") == 0) o->autotune = 1;
            else if (strcmp(name, "--no-autotune") == 0) o->autotune = -1;
            else if (strcmp(name, "--normalize") == 0) o->normalize = 1;
            else if (strcmp(name, "--projected") == 0) o->projected = 1;
            else return usage_error("unknown option '%s'", qkcli_arg(name));
            continue;
        }
        if (seen[k]++) return usage_error("option %s is given twice", name);
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return usage_error("option %s needs a value", name);
        if (!strcmp(name, "--map")) o->map = v;
        else if (!strcmp(name, "--x")) o->x = v;
        else if (!strcmp(name, "--y")) o->y = v;
        else if (!strcmp(name, "--out")) o->out = v;
        else if (!strcmp(name, "--weights")) o->weights = v;
        else if (!strcmp(name, "--data")) o->data = v;
        else if (!strcmp(name, "--profile")) o->profile = v;
        else if (!strcmp(name, "--cache-dir")) o->cache_dir = v;
        else if (!strcmp(name, "--trace")) o->trace = v;
        else if (!strcmp(name, "--html")) o->html = v;
        else if (!strcmp(name, "--states")) o->states = v;
        else if (!strcmp(name, "--states-y")) o->states_y = v;
        else if (!strcmp(name, "--norm-tol")) {
            if ((err = qkcli_norm_tol(v, &o->norm_tol)) != NULL) return usage_error(err, qkcli_arg(v));
        }
        else if (!strcmp(name, "--gamma")) {   /* C syntax, finite and > 0 as qk_gram_projected takes it */
            char *end = NULL;
            double t = strtod(v, &end);
            if (*v == 0 || !end || *end || !(t > 0.0 && t < 1e300))
                return usage_error("--gamma '%s': expected a number > 0", qkcli_arg(v));
            o->gamma = t;
        }
        else if (!strcmp(name, "--device")) {
            if ((err = qkcli_device(v, &o->device)) != NULL) return usage_error(err, qkcli_arg(v));
        } else if (!strcmp(name, "--precision")) {
            if ((err = qkcli_precision(v, &o->precision)) != NULL) return usage_error(err, qkcli_arg(v));
        } else if (!strcmp(name, "--tol")) {
            if ((err = qkcli_tol(v, &o->tol)) != NULL) return usage_error(err, qkcli_arg(v));
        } else if (!strcmp(name, "--gpus")) {
            /* "all", or distinct ordinals 0..4095 separated by commas (digits only) */
            const char *c = v;
            if (!strcmp(v, "all")) continue;
            for (;;) {
                long t = 0;
                const char *d0 = c;
                int j;
                while (*c >= '0' && *c <= '9' && t <= 4096) t = t * 10 + (*c++ - '0');
                if (c == d0 || t > 4095 || (*c && *c != ','))
                    return usage_error("--gpus '%s': expected all or CUDA device ordinals such as 0,1", qkcli_arg(v));
                for (j = 0; j < o->n_gpus; j++)
                    if (o->gpus[j] == (int)t) return usage_error("--gpus '%s': a device is listed twice", qkcli_arg(v));
                if (o->n_gpus == QK_MAX_DEVICES) return usage_error("--gpus '%s': at most %d devices", qkcli_arg(v), QK_MAX_DEVICES);
                o->gpus[o->n_gpus++] = (int)t;
                if (!*c) break;
                c++;
            }
        } else if (!strcmp(name, "--path")) {
            if (!strcmp(v, "auto")) o->path = QK_PATH_DEFAULT;
            else if (!strcmp(v, "mps")) o->path = QK_PATH_MPS;
            else if (!strcmp(v, "statevector")) o->path = QK_PATH_COMPLEX;
            else return usage_error("--path '%s': expected auto, mps or statevector", qkcli_arg(v));
        } else {   /* --threads: digits only (no sign, blanks or locale forms), 1..4096 */
            const char *c = v;
            long t = 0;
            while (*c >= '0' && *c <= '9' && t <= 4096) t = t * 10 + (*c++ - '0');
            if (*v == 0 || *c || t < 1 || t > 4096) return usage_error("--threads '%s': expected a count from 1 to 4096", qkcli_arg(v));
            o->threads = (int)t;
        }
    }
    if (o->tol > 0.0 && o->precision != QK_PRECISION_AUTO && o->precision != QK_PRECISION_DEFAULT)
        return usage_error("--tol applies to --precision auto (and the default), not to an explicit mode");
    return -1;
}

/* The canonical name of a path for comparisons: realpath of the file, or of its directory plus
   its name when it does not exist yet. Empty when neither resolves. */
static void canonical_path(const char *path, char *buf, size_t size) {
    char dir[4096], *r;
    const char *slash = strrchr(path, '/');
    buf[0] = 0;
    r = realpath(path, NULL);
    if (r) {
        snprintf(buf, size, "%s", r);
        free(r);
        return;
    }
    if (slash) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        if (dl >= sizeof dir) return;
        memcpy(dir, path, dl);
        dir[dl] = 0;
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    r = realpath(dir, NULL);
    if (r) {
        snprintf(buf, size, "%s/%s", r, slash ? slash + 1 : path);
        free(r);
    }
}

/* 1 when a and b name the same file: the same device and inode (hard links, symlinks, "./x"),
   or, for files that do not exist yet, the same canonical path. */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    char ca[4200], cb[4200];
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ea != eb) return 0;
    if (strcmp(a, b) == 0) return 1;
    canonical_path(a, ca, sizeof ca);
    canonical_path(b, cb, sizeof cb);
    return ca[0] && strcmp(ca, cb) == 0;
}

/* What the mode needs, and outputs that would overwrite an input or each other. */
static int check_args(const options *o) {
    const char *in[5], *in_name[5] = {"--x", "--y", "--weights", "--states", "--states-y"};
    const char *outp[4], *out_name[4] = {"--out", "--profile", "--trace", "--html"};
    int i, j;
    if (o->demo) {
        if (o->x || o->y || o->out || o->weights) return usage_error("--demo takes no --x, --y, --out or --weights", NULL);
        if (o->states || o->states_y) return usage_error("--demo takes no --states or --states-y", NULL);
    } else if (o->states || o->states_y) {
        /* K from given states: no map, no samples */
        if (!o->states) return usage_error("--states-y needs --states (the first set of states)", NULL);
        if (o->map) return usage_error("--states and --map exclude each other: K comes from the given states, or from a "
                                       "feature map of samples (--map with --x)", NULL);
        if (o->x || o->y) return usage_error("--states and --%s exclude each other (a second set of states is --states-y)",
                                             o->x ? "x" : "y");
        if (o->weights) return usage_error("--weights goes with --map, not --states", NULL);
        if (o->path == QK_PATH_MPS) return usage_error("--path mps: given states take the statevector path", NULL);
        if (!o->out) return usage_error("--out is required", NULL);
        if (o->data) return usage_error("--data goes with --demo", NULL);
        if (!qkcli_ends_with(o->out, ".npy")) return usage_error("--out '%s': the output must be a .npy file", o->out);
    } else {
        if (!o->map) return usage_error("--map is required (e.g. --map 'zz(reps=2)')", NULL);
        if (!o->x) return usage_error("--x is required", NULL);
        if (!o->out) return usage_error("--out is required", NULL);
        if (o->data) return usage_error("--data goes with --demo", NULL);
        if (!qkcli_ends_with(o->out, ".npy")) return usage_error("--out '%s': the output must be a .npy file", o->out);
    }
    if (!o->states && (o->normalize || o->norm_tol > 0.0))
        return usage_error("%s goes with --states", o->normalize ? "--normalize" : "--norm-tol");
    if (o->gamma > 0.0 && !o->projected) return usage_error("--gamma goes with --projected", NULL);
    if (o->projected) {   /* the projected kernel: a map's states (statevector, MPS or product), K in memory */
        if (o->demo || o->states) return usage_error("--projected goes with --map and --x, not %s", o->demo ? "--demo" : "--states");
        if (o->tol > 0.0) return usage_error("--tol goes with the fidelity kernel's --precision auto, not --projected", NULL);
        if (o->n_gpus > 1)
            return usage_error("--gpus: --projected runs on one GPU (the context's first): give one ordinal, or all (the first visible)", NULL);
    }
    if ((o->profile || o->trace || o->html) && !QK_PROF_ENABLED)
        return usage_error("--profile/--trace/--html: this qk-gram was built without the profiler (QK_PROF_ENABLE)", NULL);
    in[0] = o->x; in[1] = o->y; in[2] = o->weights; in[3] = o->states; in[4] = o->states_y;
    outp[0] = o->out; outp[1] = o->profile && strcmp(o->profile, "-") ? o->profile : NULL; outp[2] = o->trace; outp[3] = o->html;
    for (i = 0; i < 4; i++) {
        if (!outp[i]) continue;
        for (j = 0; j < 5; j++)
            if (in[j] && same_file(outp[i], in[j]))
                return usage_error("%s '%s' and %s '%s' are the same file: the output would overwrite the input",
                                   out_name[i], outp[i], in_name[j], in[j]);
        for (j = 0; j < i; j++)
            if (outp[j] && same_file(outp[i], outp[j]))
                return usage_error("%s '%s' and %s '%s' are the same file", out_name[j], outp[j], out_name[i], outp[i]);
    }
    return -1;
}

/* The context from the command line: device, threads, autotune mode and cache. */
static qk_result make_ctx(const options *o, qk_ctx **ctx) {
    qk_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = o->device;
    cd.n_threads = o->threads;
    if (o->n_gpus > 0) {   /* --gpus 0,1 (default, and --gpus all: every visible device) */
        cd.cuda_devices = o->gpus;
        cd.n_cuda_devices = o->n_gpus;
    }
    cd.autotune = o->autotune;
    cd.cache_dir = o->cache_dir;
    return qk_ctx_create(&cd, ctx);
}

/* ---- --projected: the projected quantum kernel (qk_gram_projected) ---- */
/* K (rows x cols, dtype) into the .npy `out` through qk's temporary file (out.tmp.<pid>.<k>.<host>),
   renamed over `out` only when no stop signal came during the write: a stop removes the temporary
   and leaves the old `out` as it was, as a stopped Gram does. Returns 0, or the exit status. */
static int write_k_npy(const options *o, const void *K, qk_dtype dtype, int64_t rows, int64_t cols) {
    char hdr[192];
    char *tmp = NULL;
    size_t nbytes = 0, nh;
    int fd = -1;
    qk_result r = qk__npy_shape_bytes("qk-gram", dtype, rows, cols, &nbytes);
    if (r != QK_OK) return fail(r, "cannot write '%s'", qkcli_arg(o->out));
    nh = qk__npy_make_header(hdr, dtype, rows, cols);
    r = qk__open_tmp(o->out, &tmp, &fd);
    if (r != QK_OK) return fail(r, "cannot write '%s'", qkcli_arg(o->out));
    if (qk__write_all(fd, hdr, nh) != 0 || qk__write_all(fd, K, nbytes) != 0 || (!o->no_sync && QK__FSYNC(fd) != 0)) {
        const int e = errno;
        (void)QK__CLOSE(fd);
        qk__tmp_discard(tmp);
        QK_FREE(tmp);
        if (stop_signal) goto stopped;
        return fail(QK_OK, "cannot write '%s': %s", qkcli_arg(o->out), qkcli_fsize_hit ? "the file size limit (ulimit -f)" : strerror(e));
    }
    if (QK__CLOSE(fd) != 0 || stop_signal) {
        const int e = errno;
        qk__tmp_discard(tmp);
        QK_FREE(tmp);
        if (stop_signal) goto stopped;
        return fail(QK_OK, "cannot write '%s': close failed: %s", qkcli_arg(o->out), strerror(e));
    }
    r = qk__tmp_commit(tmp, o->out, o->no_sync);
    QK_FREE(tmp);
    return r == QK_OK ? EXIT_SUCCESS : fail(r, "cannot write '%s'", qkcli_arg(o->out));
stopped:
    fprintf(stderr, "qk-gram: %s: stopped; '%s' was not written\n", stop_what(stop_signal), qkcli_arg(o->out));
    return 128 + (int)stop_signal;
}

/* A job on --map: X, Y (no --y: rows 0), the map, the context. */
typedef struct map_job {
    qk_array X, Y;
    qk_map *map;
    qk_ctx *ctx;
} map_job;

/* --x (and --y), their feature counts matched, and --map parsed for them with --weights into j
   (the context not yet made); prints the error itself. What it read is freed by map_job_free,
   also after a failure. */
static int read_job(const options *o, map_job *j) {
    qk_array *X = &j->X, *Y = &j->Y;
    qk_result r;
    memset(j, 0, sizeof *j);
    if (read_samples("X", o->x, X) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (o->y && read_samples("Y", o->y, Y) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (o->y && Y->cols != X->cols)
        return fail(QK_OK, "feature count mismatch: X ('%s') has %lld features (columns), Y ('%s') has %lld", qkcli_arg(o->x),
                    (long long)X->cols, qkcli_arg(o->y), (long long)Y->cols);
    if (X->cols > 0x7fffffff) return fail(QK_OK, "X has too many features (%lld)", (long long)X->cols);
    r = qk_map_parse(o->map, (int)X->cols, &j->map);
    if (r != QK_OK) {
        fail(r, "--map '%s'", qkcli_arg(o->map));
        show_spec_column(o->map);
        return EXIT_FAILURE;
    }
    return read_weights(o->weights, j->map, o->quiet);
}

static void map_job_free(map_job *j) {
    qk_ctx_destroy(j->ctx);
    qk_map_free(j->map);
    qk_array_free(&j->X);
    qk_array_free(&j->Y);
}

/* The job's Gram desc: X, Y, --precision and --path (the output and the rest the caller's) */
static qk_gram_desc map_job_desc(const options *o, const map_job *j) {
    return (qk_gram_desc){ .x = j->X.data, .n_x = j->X.rows, .y = o->y ? j->Y.data : NULL, .n_y = o->y ? j->Y.rows : 0,
                           .precision = o->precision, .path = o->path };
}

/* The path qk_gram_projected takes for this map and desc, in words, by its own choice
   (qk__mps_decide_cpu, as qk_gram's CPU plan chooses; product maps: their qubits' states,
   whatever --path says). 0 where that choice is an error, which qk_gram_projected then reports. */
static int projected_path(const qk_map *map, const qk_gram_desc *gd, char *buf, size_t size) {
    qk__mps_prog prog;
    int use = 0;
    if (map->cls == QK_CLASS_PRODUCT) {
        snprintf(buf, size, "product map (each qubit's state)");
        return 1;
    }
    if (qk__mps_decide_cpu(map, gd, &prog, &use) != QK_OK) return 0;
    if (use) {
        snprintf(buf, size, "path mps (bond dimension %d)", prog.chi);
        qk__mps_prog_free(&prog);
    } else {
        snprintf(buf, size, "path statevector");
    }
    return 1;
}

static int projected_main(const options *o) {
    map_job job;
    qk_gram_desc gd;
    qk_result r;
    const qk_dtype dtype = o->precision == QK_PRECISION_FP32 ? QK_F32 : QK_F64;
    const double gamma = o->gamma > 0.0 ? o->gamma : 1.0;
    double t0, secs;
    void *K = NULL;
    int rc = EXIT_FAILURE, have_y = o->y != NULL;
    int64_t n_rows, n_cols;
    struct sigaction old_sa[3];

    if (check_outputs(o) != EXIT_SUCCESS) return EXIT_FAILURE;
    /* Until K is written no output exists: a stop exits at once (stop_exits) with run_gram's line;
       during the write it is recorded, and write_k_npy removes the temporary. */
    stop_notes(o->out);
    stop_exits = 1;
    stop_install(old_sa);

    if (read_job(o, &job) != EXIT_SUCCESS) goto done;
    n_rows = job.X.rows;
    n_cols = have_y ? job.Y.rows : n_rows;
    if ((double)n_rows * (double)n_cols * (dtype == QK_F32 ? 4.0 : 8.0) > (double)SIZE_MAX / 2 ||
        !(K = malloc((size_t)(n_rows * n_cols) * (dtype == QK_F32 ? 4 : 8)))) {
        fail(QK_ERROR_OUT_OF_MEMORY, "K (%lld x %lld) in memory", (long long)n_rows, (long long)n_cols);
        goto done;
    }
    gd = map_job_desc(o, &job);
    gd.output = QK_OUTPUT_HOST;
    gd.out = K;
    gd.out_dtype = dtype;
    r = make_ctx(o, &job.ctx);   /* as for --map: --device, --gpus (its first GPU), --threads */
    if (r != QK_OK) { fail(r, "cannot create the qk context"); goto done; }
    if (!o->quiet) {
        char spec[512], engine[64], path[96];
        const qk_ctx_desc cq = qk_ctx_query(job.ctx);
        const qk_map *map = job.map;
        qk_map_spec(map, spec, sizeof spec);
        printf("map:  %s  (%d qubits, %d features, %s)\n", spec, map->n_qubits, map->n_features, qk_map_class_string(map->cls));
        printf("data: X %s (%lld x %lld)%s%s%s\n", qkcli_arg(o->x), (long long)n_rows, (long long)job.X.cols, have_y ? ", Y " : "",
               have_y ? qkcli_arg(o->y) : "", have_y ? "" : ", K = K(X, X) (symmetric)");
        if (cq.device == QK_DEVICE_CUDA)
            snprintf(engine, sizeof engine, "CUDA engine on GPU %d", cq.n_cuda_devices > 0 && cq.cuda_devices ? cq.cuda_devices[0] : 0);
        else
            snprintf(engine, sizeof engine, "CPU engine");
        if (projected_path(map, &gd, path, sizeof path))
            printf("projected quantum kernel, gamma %g: K = exp(-gamma sum_k ||rho_k(x) - rho_k(y)||_F^2), %s, %s, fp64\n",
                   gamma, engine, path);
    }
    t0 = qkcli_now();
    r = qk_gram_projected(job.ctx, job.map, &gd, gamma);
    secs = qkcli_now() - t0;
    if (r != QK_OK) { fail(r, "projected kernel failed"); goto done; }
    stop_exits = 0;   /* from here a temporary file may exist: a stop is recorded, write_k_npy cleans up */
    rc = write_k_npy(o, K, dtype, n_rows, n_cols);
    if (rc == EXIT_SUCCESS && !o->quiet)
        printf("done: K %lld x %lld (%s) -> %s; %lld pairs in %.3f s\n", (long long)n_rows, (long long)n_cols,
               dtype == QK_F32 ? "float32" : "float64", qkcli_arg(o->out), (long long)(n_rows * n_cols), secs);
done:
    stop_exits = 0;
    stop_restore(old_sa);
    free(K);
    map_job_free(&job);
    return rc;
}

/* ---- the main job ---- */
static int gram_main(const options *o) {
    map_job job;
    qk_gram_desc gd;
    qk_result r;
    qk_dtype dtype = QK_F64;
    double secs = 0;
    int rc = EXIT_FAILURE, have_y = o->y != NULL;
    int64_t n_cols, pairs;

    /* check_args has seen --map, --x and --out given, --out a .npy and no input */
    if (check_outputs(o) != EXIT_SUCCESS) return EXIT_FAILURE;

    if (read_job(o, &job) != EXIT_SUCCESS) goto done;
    /* Validate the data before allocating K: the detail names the row and column. */
    r = qk_map_check_data(job.map, job.X.data, job.X.rows, "X");
    if (r != QK_OK) { fail(r, "bad data in '%s'", qkcli_arg(o->x)); goto done; }
    if (have_y) {
        r = qk_map_check_data(job.map, job.Y.data, job.Y.rows, "Y");
        if (r != QK_OK) { fail(r, "bad data in '%s'", qkcli_arg(o->y)); goto done; }
    }

    r = make_ctx(o, &job.ctx);
    if (r != QK_OK) { fail(r, "cannot create the qk context"); goto done; }

    gd = map_job_desc(o, &job);
    gd.tol = o->tol;
    if (!o->quiet)
        printf("data: X %s (%lld x %lld)%s%s%s\n", qkcli_arg(o->x), (long long)job.X.rows, (long long)job.X.cols, have_y ? ", Y " : "",
               have_y ? qkcli_arg(o->y) : "", have_y ? "" : ", K = K(X, X) (symmetric)");
    rc = run_gram(job.ctx, job.map, NULL, &gd, o, &dtype, &secs);
    if (rc != EXIT_SUCCESS) goto done;
    rc = EXIT_FAILURE;

    n_cols = have_y ? job.Y.rows : job.X.rows;
    /* Gpairs/s counts every entry of K, as docs/benchmarks.md and the peers do; the symmetric
       K(X, X) computes the i <= j entries only and mirrors the rest (said in the line). */
    pairs = job.X.rows * n_cols;
    if (!o->quiet)
        printf("done: K %lld x %lld (%s) -> %s; %lld pairs%s in %.3f s, %.3g Gpairs/s\n", (long long)job.X.rows,
               (long long)n_cols, dtype == QK_F32 ? "float32" : "float64", qkcli_arg(o->out), (long long)pairs,
               have_y ? "" : " (i <= j computed, mirrored)", secs, secs > 0 ? (double)pairs / secs * 1e-9 : 0.0);
    rc = EXIT_SUCCESS;
done:
    map_job_free(&job);
    return rc;
}

/* ---- --states: K from given states (qk_gram_states) ---- */

/* Reads a .npy of states (qkcli_read_states); prints the error itself. */
static int read_states(const char *what, const char *opt, const char *path, qk_states_array *s) {
    char msg[1024];
    qk_result r;
    return qkcli_read_states(what, opt, path, s, msg, sizeof msg, &r) ? fail(r, "%s", msg) : EXIT_SUCCESS;
}

static int states_main(const options *o) {
    qk_states_array A, B;
    void *conv[2] = {NULL, NULL};   /* converted copies (malloc) that replaced A's or B's data */
    qk_ctx *ctx = NULL;
    qk_states_desc st;
    qk_gram_desc gd;
    qk_dtype dtype = QK_F64;
    qk_result r;
    double secs = 0;
    char msg[1024];
    int rc = EXIT_FAILURE, have_b = o->states_y != NULL;
    struct sigaction old_sa[3];
    options oc = *o;

    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    if (check_outputs(o) != EXIT_SUCCESS) return EXIT_FAILURE;

    /* A stop while the states are read (gigabytes, maybe) or converted: no output exists yet,
       so the handler exits at once (stop_exits), with the line run_gram would print. */
    stop_notes(o->out);
    stop_exits = 1;
    stop_install(old_sa);

    if (read_states("A", "--states", o->states, &A) != EXIT_SUCCESS) goto done;
    if (have_b && read_states("B", "--states-y", o->states_y, &B) != EXIT_SUCCESS) goto done;
    /* one type for both sides (float input keeps the float tolerance when it is widened) */
    if (qkcli_states_desc(&A, &B, o->states, o->states_y, o->normalize, o->norm_tol, conv, &st, msg, sizeof msg, &r)) {
        fail(r, "%s", msg);
        goto done;
    }

    /* From here a stop is recorded and the run ends at its first poll (the context and the plan
       may write the autotune cache, whose temporary an exit here would leave). */
    stop_exits = 0;
    r = make_ctx(&oc, &ctx);
    if (r != QK_OK) { fail(r, "cannot create the qk context"); goto done; }

    memset(&gd, 0, sizeof gd);
    gd.precision = o->precision;
    gd.tol = o->tol;
    gd.path = o->path;
    if (!o->quiet) {
        printf("data: A %s (%lld %s of dim %lld, %s)", qkcli_arg(o->states), (long long)A.n, A.mixed ? "density matrices" : "states",
               (long long)A.dim, qkcli_state_type_name(st.type));
        if (have_b)
            printf(", B %s (%lld %s, %s)\n", qkcli_arg(o->states_y), (long long)B.n, B.mixed ? "density matrices" : "states",
                   qkcli_state_type_name(st.type));
        else printf(", K = K(A, A) (symmetric)\n");
        if (A.mixed || B.mixed) printf("K[i][j] = Tr(rho_i rho_j)%s\n", A.mixed != B.mixed && have_b ? " (a pure state as |psi><psi|)" : "");
    }
    rc = run_gram(ctx, NULL, &st, &gd, o, &dtype, &secs);
    if (rc == EXIT_SUCCESS && !o->quiet) {
        const int64_t cols = have_b ? B.n : A.n, pairs = A.n * cols;
        printf("done: K %lld x %lld (%s) -> %s; %lld pairs%s in %.3f s, %.3g Gpairs/s\n", (long long)A.n, (long long)cols,
               dtype == QK_F32 ? "float32" : "float64", qkcli_arg(o->out), (long long)pairs,
               have_b ? "" : " (i <= j computed, mirrored)", secs, secs > 0 ? (double)pairs / secs * 1e-9 : 0.0);
    }
done:
    stop_exits = 0;
    stop_restore(old_sa);
    qk_ctx_destroy(ctx);
    if (conv[0]) { free(conv[0]); A.data = NULL; }
    if (conv[1]) { free(conv[1]); B.data = NULL; }
    qk_states_array_free(&A);
    qk_states_array_free(&B);
    return rc;
}

/* ---- --demo: Iris, zz kernel, kernel ridge one-vs-rest ---- */

static uint64_t demo_rng = 2026;   /* fixed seed: the demo prints the same split every time */
static uint64_t splitmix64(void) {
    uint64_t z = (demo_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Cholesky factorization A = L L^T in place (lower triangle); 0 when A is not positive definite. */
static int cholesky(double *a, int n) {
    int i, j, k;
    for (j = 0; j < n; j++) {
        double d = a[j * n + j];
        for (k = 0; k < j; k++) d -= a[j * n + k] * a[j * n + k];
        if (!(d > 0)) return 0;
        d = sqrt(d);
        a[j * n + j] = d;
        for (i = j + 1; i < n; i++) {
            double s = a[i * n + j];
            for (k = 0; k < j; k++) s -= a[i * n + k] * a[j * n + k];
            a[i * n + j] = s / d;
        }
    }
    return 1;
}
/* Solves L L^T x = b in place. */
static void cholesky_solve(const double *l, int n, double *b) {
    int i, k;
    for (i = 0; i < n; i++) {
        double s = b[i];
        for (k = 0; k < i; k++) s -= l[i * n + k] * b[k];
        b[i] = s / l[i * n + i];
    }
    for (i = n - 1; i >= 0; i--) {
        double s = b[i];
        for (k = i + 1; k < n; k++) s -= l[k * n + i] * b[k];
        b[i] = s / l[i * n + i];
    }
}

static FILE *open_demo_data(const options *o, char *path, size_t size) {
    const char *dirs[3];
    int n = 0, i;
    FILE *f;
    if (o->data) dirs[n++] = o->data;
    else {
        dirs[n++] = QK_DEMO_DATA;   /* the source tree, set by meson */
#ifdef QK_DEMO_DATA_INSTALLED
        dirs[n++] = QK_DEMO_DATA_INSTALLED;   /* <prefix>/share/qk after meson install */
#endif
    }
    for (i = 0; i < n; i++) {
        snprintf(path, size, "%s/iris.csv", dirs[i]);
        if ((f = fopen(path, "rb")) != NULL) return f;
    }
    fprintf(stderr, "qk-gram: error: cannot find iris.csv in");
    for (i = 0; i < n; i++) fprintf(stderr, " '%s'", qkcli_arg(dirs[i]));
    fprintf(stderr, "; pass --data DIR (the repository's examples/data)\n");
    return NULL;
}

enum { IRIS_FEATURES = 4, IRIS_CLASSES = 3 };

static const double demo_ridge = 0.1;   /* the numpy study in demo_main: 0.01..0.1 all work */
static const double demo_train_share = 0.7;

/* The demo from the data to the predictions; demo_free releases it. */
typedef struct demo {
    char path[1024];        /* iris.csv */
    qk_array data;          /* rows of IRIS_FEATURES features and the class */
    int n, n_tr, n_te;
    int *tr, *te;           /* rows of the training and the test samples */
    double *xtr, *xte;      /* their features, scaled to [0, pi] */
    double *ktr, *kte;      /* K(X_train, X_train) (then its Cholesky factor), K(X_test, X_train) */
    double s_tr, s_te;      /* seconds per Gram */
    double *alpha;          /* ridge coefficients: IRIS_CLASSES columns of n_tr */
    int confusion[IRIS_CLASSES][IRIS_CLASSES], correct;
} demo;

static int demo_class(const demo *dm, int row) { return (int)dm->data.data[row * 5 + 4]; }

static void demo_free(demo *dm) {
    free(dm->tr);
    free(dm->te);
    free(dm->xtr);
    free(dm->xte);
    free(dm->ktr);
    free(dm->kte);
    free(dm->alpha);
    qk_array_free(&dm->data);
}

/* Load: iris.csv, checked for 4 feature columns, a class column and classes 0, 1, 2. */
static int demo_load(const options *o, demo *dm) {
    FILE *f;
    qk_result r;
    int i;
    if (!(f = open_demo_data(o, dm->path, sizeof dm->path))) return EXIT_FAILURE;
    fclose(f);
    r = qk_csv_read(dm->path, &dm->data);
    if (r != QK_OK) return fail(r, "cannot read the demo data");
    dm->n = (int)dm->data.rows;
    if (dm->data.cols != IRIS_FEATURES + 1 || dm->n < 3 * IRIS_CLASSES)
        return fail(QK_OK, "%s: expected 4 feature columns and a class column, got %lld columns", qkcli_arg(dm->path),
                    (long long)dm->data.cols);
    for (i = 0; i < dm->n; i++) {
        double y = dm->data.data[i * 5 + 4];
        if (!(y == 0 || y == 1 || y == 2)) return fail(QK_OK, "%s: row %d: class %g is not 0, 1 or 2", qkcli_arg(dm->path), i + 1, y);
    }
    return EXIT_SUCCESS;
}

/* Split: stratified, each class shuffled with the fixed seed, the first 70% train. */
static int demo_split(demo *dm) {
    int n = dm->n, c, i;
    int *idx = (int *)malloc(sizeof(int) * (size_t)n);
    dm->tr = (int *)malloc(sizeof(int) * (size_t)n);
    dm->te = (int *)malloc(sizeof(int) * (size_t)n);
    if (!idx || !dm->tr || !dm->te) { free(idx); return fail(QK_ERROR_OUT_OF_MEMORY, "out of memory"); }
    for (c = 0; c < IRIS_CLASSES; c++) {
        int m = 0, k;
        for (i = 0; i < n; i++)
            if (demo_class(dm, i) == c) idx[m++] = i;
        for (i = m - 1; i > 0; i--) {
            int t, s = (int)(splitmix64() % (uint64_t)(i + 1));
            t = idx[i]; idx[i] = idx[s]; idx[s] = t;
        }
        k = (int)(demo_train_share * m + 0.5);
        for (i = 0; i < m; i++) {
            if (i < k) dm->tr[dm->n_tr++] = idx[i];
            else dm->te[dm->n_te++] = idx[i];
        }
    }
    free(idx);
    if (dm->n_tr == 0 || dm->n_te == 0) return fail(QK_OK, "%s: too few samples to split", qkcli_arg(dm->path));
    return EXIT_SUCCESS;
}

/* Scale: features to [0, pi] with the training set's min and max (test samples may fall slightly
   outside: the test set must not inform the scaling). */
static int demo_scale(demo *dm) {
    const double *x = dm->data.data;
    double lo[IRIS_FEATURES], hi[IRIS_FEATURES];
    int i, j;
    for (j = 0; j < IRIS_FEATURES; j++) {
        lo[j] = hi[j] = x[dm->tr[0] * 5 + j];
        for (i = 1; i < dm->n_tr; i++) {
            double v = x[dm->tr[i] * 5 + j];
            if (v < lo[j]) lo[j] = v;
            if (v > hi[j]) hi[j] = v;
        }
        if (hi[j] <= lo[j]) hi[j] = lo[j] + 1;
    }
    dm->xtr = (double *)malloc(sizeof(double) * (size_t)dm->n_tr * IRIS_FEATURES);
    dm->xte = (double *)malloc(sizeof(double) * (size_t)dm->n_te * IRIS_FEATURES);
    if (!dm->xtr || !dm->xte) return fail(QK_ERROR_OUT_OF_MEMORY, "out of memory");
    for (i = 0; i < dm->n_tr + dm->n_te; i++) {
        int s = i < dm->n_tr ? dm->tr[i] : dm->te[i - dm->n_tr];
        double *dst = i < dm->n_tr ? dm->xtr + (size_t)i * IRIS_FEATURES : dm->xte + (size_t)(i - dm->n_tr) * IRIS_FEATURES;
        for (j = 0; j < IRIS_FEATURES; j++) dst[j] = (x[s * 5 + j] - lo[j]) / (hi[j] - lo[j]) * DEMO_PI;
    }
    return EXIT_SUCCESS;
}

/* One float64 Gram of the demo into a fresh buffer (*out, freed by the caller). */
static int demo_gram(qk_ctx *ctx, const qk_map *map, qk_gram_desc *gd, int quiet, double **out, double *seconds) {
    int64_t cols = gd->y ? gd->n_y : gd->n_x;
    double t0;
    qk_result r;
    print_plan(ctx, map, NULL, gd, NULL, quiet);
    *out = (double *)malloc(sizeof(double) * (size_t)(gd->n_x * cols));
    if (!*out) return fail(QK_ERROR_OUT_OF_MEMORY, "out of memory");
    gd->out = *out;
    t0 = qkcli_now();
    r = qk_gram(ctx, map, gd);
    *seconds = qkcli_now() - t0;
    if (r != QK_OK) return fail(r, "Gram failed");
    return EXIT_SUCCESS;
}

/* The desc of the demo's Gram K(x, y) (K(x, x) when y is NULL), float64. */
static qk_gram_desc demo_desc(const options *o, const double *x, int n_x, const double *y, int n_y) {
    qk_gram_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.x = x;
    gd.n_x = n_x;
    gd.y = y;
    gd.n_y = n_y;
    gd.out_dtype = QK_F64;
    gd.precision = o->precision;
    gd.tol = o->tol;
    return gd;
}

/* The kernels: K_train = K(X_train, X_train), K_test = K(X_test, X_train), in float64. */
static int demo_kernels(qk_ctx *ctx, const qk_map *map, const options *o, demo *dm) {
    qk_gram_desc gd = demo_desc(o, dm->xtr, dm->n_tr, NULL, 0);
    if (demo_gram(ctx, map, &gd, o->quiet, &dm->ktr, &dm->s_tr) != EXIT_SUCCESS) return EXIT_FAILURE;
    gd = demo_desc(o, dm->xte, dm->n_te, dm->xtr, dm->n_tr);
    if (demo_gram(ctx, map, &gd, 1, &dm->kte, &dm->s_te) != EXIT_SUCCESS) return EXIT_FAILURE;
    printf("kernels: K_train %d x %d in %.4f s, K_test %d x %d in %.4f s\n", dm->n_tr, dm->n_tr, dm->s_tr, dm->n_te,
           dm->n_tr, dm->s_te);
    return EXIT_SUCCESS;
}

/* Train: kernel ridge regression one-vs-rest, (K_train + ridge I) A = Y with Y[i][c] = +1 for
   the sample's class and -1 otherwise (K_train becomes its Cholesky factor). */
static int demo_train(demo *dm) {
    int n_tr = dm->n_tr, i, c;
    for (i = 0; i < n_tr; i++) dm->ktr[(size_t)i * n_tr + i] += demo_ridge;
    if (!cholesky(dm->ktr, n_tr)) return fail(QK_OK, "K_train + %g I is not positive definite", demo_ridge);
    dm->alpha = (double *)malloc(sizeof(double) * (size_t)n_tr * IRIS_CLASSES);
    if (!dm->alpha) return fail(QK_ERROR_OUT_OF_MEMORY, "out of memory");
    for (c = 0; c < IRIS_CLASSES; c++) {
        double *a = dm->alpha + (size_t)c * n_tr;
        for (i = 0; i < n_tr; i++) a[i] = demo_class(dm, dm->tr[i]) == c ? 1.0 : -1.0;
        cholesky_solve(dm->ktr, n_tr, a);
    }
    return EXIT_SUCCESS;
}

/* Evaluate: each test sample's predicted class is argmax_c (K_test A)[., c]; the confusion
   matrix and the number correct. */
static void demo_evaluate(demo *dm) {
    int n_tr = dm->n_tr, i, j, c;
    for (i = 0; i < dm->n_te; i++) {
        int truth = demo_class(dm, dm->te[i]), best = 0;
        double best_score = -HUGE_VAL;
        for (c = 0; c < IRIS_CLASSES; c++) {
            double s = 0;
            for (j = 0; j < n_tr; j++) s += dm->kte[(size_t)i * n_tr + j] * dm->alpha[(size_t)c * n_tr + j];
            if (s > best_score) { best_score = s; best = c; }
        }
        dm->confusion[truth][best]++;
        dm->correct += best == truth;
    }
}

/* Report: the classifier, the confusion matrix, the test accuracy. */
static void demo_report(const demo *dm) {
    static const char *class_names[IRIS_CLASSES] = {"setosa", "versicolor", "virginica"};
    int c, j;
    printf("classifier: kernel ridge one-vs-rest (ridge %g, Cholesky)\n", demo_ridge);
    printf("confusion (rows: true, columns: predicted):\n");
    for (c = 0; c < IRIS_CLASSES; c++) {
        printf("  %-10s", class_names[c]);
        for (j = 0; j < IRIS_CLASSES; j++) printf(" %3d", dm->confusion[c][j]);
        printf("\n");
    }
    printf("test accuracy: %.4f (%d/%d)\n", (double)dm->correct / dm->n_te, dm->correct, dm->n_te);
}

/* --demo: load, split, scale; the kernels; train, evaluate, report. */
static int demo_main(const options *o) {
    /* alpha = 0.5 instead of Qiskit's 2: with features in [0, pi], alpha = 2 spreads the states so
       far apart that K is close to the identity and ridge regression overfits (test accuracy 0.78
       with numpy on this split design; 0.93-0.95 with alpha = 0.5; ridge 0.01..0.1 all work). */
    const char *spec = o->map ? o->map : "zz(reps=2,alpha=0.5)";
    demo dm;
    qk_map *map = NULL;
    qk_ctx *ctx = NULL;
    qk_result r;
    int rc = EXIT_FAILURE;
    memset(&dm, 0, sizeof dm);
    if (o->x || o->y || o->out || o->weights) die_usage("--demo takes no --x, --y, --out or --weights", NULL);
    if (check_prof_outputs(o) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (demo_load(o, &dm) != EXIT_SUCCESS || demo_split(&dm) != EXIT_SUCCESS || demo_scale(&dm) != EXIT_SUCCESS)
        goto done;
    r = qk_map_parse(spec, IRIS_FEATURES, &map);
    if (r != QK_OK) { fail(r, "--map '%s'", qkcli_arg(spec)); show_spec_column(spec); goto done; }
    r = make_ctx(o, &ctx);
    if (r != QK_OK) { fail(r, "cannot create the qk context"); goto done; }
    printf("qk-gram --demo: Iris (Fisher 1936, UCI ML Repository, CC BY 4.0), %s\n", qkcli_arg(dm.path));
    printf("data: %d samples, %d features scaled to [0, pi], %d classes; stratified split (seed 2026): "
           "%d train / %d test\n", dm.n, IRIS_FEATURES, IRIS_CLASSES, dm.n_tr, dm.n_te);
    if (demo_kernels(ctx, map, o, &dm) != EXIT_SUCCESS || demo_train(&dm) != EXIT_SUCCESS) goto done;
    demo_evaluate(&dm);
    demo_report(&dm);
    rc = EXIT_SUCCESS;
done:
    demo_free(&dm);
    qk_ctx_destroy(ctx);
    qk_map_free(map);
    return rc;
}

#ifndef QK_GRAM_NO_MAIN   /* tests/fuzz/fuzz_qk_gram_args.c and fuzz_weights.c include this file for its parsers */
int main(int argc, char **argv) {
    options o;
    int pa;
    qkcli_catch_fsize();   /* a write past ulimit -f: an error, the temporary file removed */
    if (argc == 1) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    /* --help and --version end here, before any qk call (no CUDA initialisation) */
    if ((pa = parse_args(argc, argv, &o)) >= 0) return pa;
    if ((pa = check_args(&o)) >= 0) return pa;
    {
        int rc = o.demo ? demo_main(&o) : o.states ? states_main(&o) : o.projected ? projected_main(&o) : gram_main(&o);
        int k_written = rc == EXIT_SUCCESS && !o.demo;
        /* profiler outputs are written after a run that succeeded or was stopped (130 / 143 / 129: the
           profile of the part that ran), not after an error: exit 1 writes no output file */
        if (rc != EXIT_FAILURE) {
            if (o.profile && QK_PROF_REPORT(o.profile) != 0) rc = prof_fail("profile", o.profile);
            if (o.trace && QK_PROF_WRITE_TRACE(o.trace) != 0) rc = prof_fail("trace", o.trace);
            if (o.html && QK_PROF_WRITE_HTML(o.html) != 0) rc = prof_fail("HTML report", o.html);
        }
        if (rc == EXIT_FAILURE && qkcli_fsize_hit) {
            char note[256];
            qkcli_fsize_note(note, sizeof note);
            fprintf(stderr, "qk-gram: error: %s\n", note);
        }
        if (k_written && rc != EXIT_SUCCESS)
            fprintf(stderr, "qk-gram: note: '%s' was written; only the profiler output failed\n", o.out);
        return rc;
    }
}
#else
/* Included without main (tests/fuzz: parse_args, check_args, read_weights): what main would run
   stays referenced here, so an includer compiles warning-free (-Wunused-function) whichever of
   these it calls, without a list of its own to keep in step with this file. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((unused))
#endif
static void qkcli_no_main_refs(void) {
    (void)gram_main; (void)demo_main; (void)states_main; (void)projected_main; (void)parse_args; (void)check_args; (void)prof_fail; (void)read_weights;
}
#endif
