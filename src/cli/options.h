/* src/cli/options.h — what qk-gram and qk-gram-mpi share of their command lines and messages:
   quoting a value in a message (qkcli_arg), writing a message with its bytes escaped
   (qkcli_put_msg), the monotonic clock, the case-blind extension test, splitting "--name=value",
   the values both take alike (--device, --precision, --tol, --norm-tol), reading --states and
   making their qk_states_desc, and catching SIGXFSZ. A parser
   returns NULL, or the message format (one %s: the value, quoted with qkcli_arg) that the program
   prints its own way. Included once by each, after qk.h and the C headers (string, stdarg,
   stdio, ctype, time, signal, sys/resource); every function is static inline, so that a program
   that uses a part only (the fuzz target that includes qk-gram.c) compiles without warnings. */
#ifndef QK_CLI_OPTIONS_H
#define QK_CLI_OPTIONS_H

/* A value from the command line (a path, the spec, an option's value) as a message quotes it:
   escaped and cut by qk.h's qk__esc_arg (control and non-ASCII bytes as \xNN, at most 200
   bytes, then "... (N bytes)"). Eight buffers in turn, so one message may quote several. */
static inline const char *qkcli_arg(const char *s) {
    static char bufs[8][QK__ESC_ARG_SIZE];
    static int next = 0;
    char *b = bufs[next];
    next = (next + 1) % 8;
    return qk__esc_arg(b, sizeof bufs[0], s);
}

/* Writes the formatted message to stderr with every byte that is not printable ASCII escaped
   (qk__esc_msg) and the whole cut to 4 KB: whatever a message quotes, a value given raw or a
   file's name in the library's detail, reaches the terminal as text. */
static inline void qkcli_put_msg(const char *fmt, va_list ap) {
    char raw[4096], esc[4096];
    vsnprintf(raw, sizeof raw, fmt, ap);
    qk__esc_msg(esc, sizeof esc, raw);
    fputs(esc, stderr);
}

static inline double qkcli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when s ends with suffix (lower case), in any case: "X.NPY" is a .npy */
static inline int qkcli_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix), i;
    if (n < m) return 0;
    for (i = 0; i < m; i++)
        if (tolower((unsigned char)s[n - m + i]) != suffix[i]) return 0;
    return 1;
}

/* "--name" or "--name=value": the name into name[size] and *eq at the '=' (NULL without one).
   Returns 0, or the message format for what is wrong: not an option, or a name too long. */
static inline const char *qkcli_split(const char *a, char *name, size_t size, const char **eq) {
    size_t nl;
    if (strncmp(a, "--", 2) != 0) return "unexpected argument '%s'";
    *eq = strchr(a, '=');
    nl = *eq ? (size_t)(*eq - a) : strlen(a);
    if (nl >= size) return "unknown option '%s'";
    memcpy(name, a, nl);
    name[nl] = 0;
    return NULL;
}

static inline const char *qkcli_device(const char *v, qk_device *d) {
    if (!strcmp(v, "auto")) *d = QK_DEVICE_AUTO;
    else if (!strcmp(v, "cpu")) *d = QK_DEVICE_CPU;
    else if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) *d = QK_DEVICE_CUDA;
    else return "--device '%s': expected auto, cpu or cuda";
    return NULL;
}

/* the library's one table of names (qk_precision_parse), with numpy's two aliases */
static inline const char *qkcli_precision(const char *v, qk_precision *p) {
    const char *pn = !strcmp(v, "float32") ? "fp32" : !strcmp(v, "float64") ? "fp64" : v;
    if (!strcmp(pn, "default") || qk_precision_parse(pn, p) != QK_OK)
        return "--precision '%s': expected auto, fp32, fp64, tf32, fp32x3 or fp16";
    return NULL;
}

/* C syntax: neither program calls setlocale */
static inline const char *qkcli_tol(const char *v, double *tol) {
    char *end = NULL;
    double t = strtod(v, &end);
    if (*v == 0 || !end || *end || !(t > 0.0 && t <= 1.0)) return "--tol '%s': expected a number in (0, 1]";
    *tol = t;
    return NULL;
}

/* ---- --states: K from given states (qk-gram's qk_gram_states, qk-gram-mpi's qk_gram_mpi_states) ---- */
static inline const char *qkcli_state_type_name(qk_state_type t) {
    return t == QK_STATE_C64 ? "complex64" : t == QK_STATE_F64 ? "float64" : t == QK_STATE_F32 ? "float32" : "complex128";
}
static inline int qkcli_state_type_double(qk_state_type t) { return t == QK_STATE_C128 || t == QK_STATE_F64; }
static inline int qkcli_state_type_complex(qk_state_type t) { return t == QK_STATE_C128 || t == QK_STATE_C64; }

/* The shape of a file of states (option opt): at least one state of dim >= 2. Returns 0, or 1
   with the message in msg. */
static inline int qkcli_states_shape(const char *opt, const char *path, int64_t n, int64_t dim, int mixed, char *msg, size_t size) {
    if (n >= 1 && dim >= 2) return 0;
    snprintf(msg, size, "%s '%s' has shape (%lld, %lld%s%s): it needs at least one state of dim >= 2", opt, qkcli_arg(path), (long long)n,
             (long long)dim, mixed ? ", " : "", mixed ? "..." : "");
    return 1;
}

/* Element k of states of type `from` at src as an element of type `to` at dst (the widening of
   qkcli_convert_states). */
static inline void qkcli_convert_elem(const void *src, qk_state_type from, int64_t k, unsigned char *dst, qk_state_type to) {
    double re, im;
    qk__state_amp(src, (int)from, k, &re, &im);
    if (to == QK_STATE_C128) { double v[2] = {re, im}; memcpy(dst, v, 16); }
    else if (to == QK_STATE_C64) { float v[2] = {(float)re, (float)im}; memcpy(dst, v, 8); }
    else if (to == QK_STATE_F64) memcpy(dst, &re, 8);
    else { float v = (float)re; memcpy(dst, &v, 4); }
}

/* Reads a .npy of states ("A" or "B", option opt): (n, dim) states or (n, dim, dim) density
   matrices, at least one, dim >= 2. Returns 0, or 1 with the message in msg and *r the result
   whose detail (qk_last_error) goes with it (QK_OK: none). */
static inline int qkcli_read_states(const char *what, const char *opt, const char *path, qk_states_array *s, char *msg, size_t size,
                                    qk_result *r) {
    *r = QK_OK;
    if (!qkcli_ends_with(path, ".npy")) {
        snprintf(msg, size, "%s '%s': states are read from a .npy file", opt, qkcli_arg(path));
        return 1;
    }
    *r = qk_npy_read_states(path, s);
    if (*r != QK_OK) {
        snprintf(msg, size, "cannot read %s (%s)", what, opt);
        return 1;
    }
    if (qkcli_states_shape(opt, path, s->n, s->dim, s->mixed, msg, size)) {
        qk_states_array_free(s);
        return 1;
    }
    return 0;
}

/* The states in type `to`: A and B of different dtypes (qk_gram_states takes one type for
   both). The converted data (malloc) replaces s->data; the caller frees it with free(). */
static inline int qkcli_convert_states(qk_states_array *s, qk_state_type to, char *msg, size_t size, qk_result *r) {
    const int64_t count = s->n * s->dim * (s->mixed ? s->dim : 1);
    const int es = to == QK_STATE_C128 ? 16 : to == QK_STATE_F32 ? 4 : 8;
    unsigned char *d;
    int64_t k;
    *r = QK_OK;
    if (s->type == to) return 0;
    d = (unsigned char *)malloc((size_t)count * (size_t)es);
    if (!d) {
        *r = QK_ERROR_OUT_OF_MEMORY;
        snprintf(msg, size, "out of memory converting %lld states to %s", (long long)s->n, qkcli_state_type_name(to));
        return 1;
    }
    for (k = 0; k < count; k++) qkcli_convert_elem(s->data, s->type, k, d + (size_t)k * (size_t)es, to);
    QK_FREE(s->data);
    s->data = d;
    s->type = to;
    return 0;
}

/* A and B (B->n 0: none) as one qk_states_desc: the same dim, one type for both (the wider in
   each respect, complex over real and double over float; a converted side's data is then a
   malloc'ed copy, recorded in conv[0] / conv[1]), --normalize, --norm-tol (0: the library's
   default, or 1e-5 where float input was widened). Sides without data (their headers only:
   qk-gram-mpi's provider reads and widens rows itself) are not converted, and st->a, st->b are
   NULL. Returns 0, or 1 with msg and *r as qkcli_read_states. */
static inline int qkcli_states_desc(qk_states_array *A, qk_states_array *B, const char *path_a, const char *path_b, int normalize,
                                    double norm_tol, void *conv[2], qk_states_desc *st, char *msg, size_t size, qk_result *r) {
    const int have_b = B->n > 0;
    qk_state_type type = A->type;
    int float_in;
    *r = QK_OK;
    if (have_b && B->dim != A->dim) {
        snprintf(msg, size, "dimension mismatch: A ('%s') has states of dim %lld, B ('%s') of dim %lld", qkcli_arg(path_a),
                 (long long)A->dim, qkcli_arg(path_b), (long long)B->dim);
        return 1;
    }
    float_in = !qkcli_state_type_double(A->type) || (have_b && !qkcli_state_type_double(B->type));
    if (have_b && B->type != A->type) {
        int cplx = qkcli_state_type_complex(A->type) || qkcli_state_type_complex(B->type);
        int dbl = qkcli_state_type_double(A->type) || qkcli_state_type_double(B->type);
        type = cplx ? (dbl ? QK_STATE_C128 : QK_STATE_C64) : (dbl ? QK_STATE_F64 : QK_STATE_F32);
        if (A->type != type && A->data) { if (qkcli_convert_states(A, type, msg, size, r)) return 1; conv[0] = A->data; }
        if (B->type != type && B->data) { if (qkcli_convert_states(B, type, msg, size, r)) return 1; conv[1] = B->data; }
    }
    *st = (qk_states_desc){
        .type = type, .dim = A->dim,
        .a = A->data, .n_a = A->n, .a_mixed = A->mixed,
        .b = have_b ? B->data : NULL, .n_b = have_b ? B->n : 0, .b_mixed = have_b && B->mixed,
        .normalize = normalize, .norm_tol = norm_tol > 0.0 ? norm_tol : float_in ? 1e-5 : 0.0,
    };
    return 0;
}

/* --norm-tol: C syntax, in (0, 1) as qk_states_desc.norm_tol */
static inline const char *qkcli_norm_tol(const char *v, double *tol) {
    char *end = NULL;
    double t = strtod(v, &end);
    if (*v == 0 || !end || *end || !(t > 0.0 && t < 1.0)) return "--norm-tol '%s': expected a number in (0, 1)";
    *tol = t;
    return NULL;
}

/* SIGXFSZ (a write past RLIMIT_FSIZE, `ulimit -f`) would kill the process and leave K's
   temporary file: caught instead (qkcli_catch_fsize), the write fails with EFBIG, qk removes the
   temporary file and the error is reported as any other; qkcli_fsize_hit says it happened and
   qkcli_fsize_note what the limit was ("...: the temporary file was removed"). */
static volatile sig_atomic_t qkcli_fsize_hit = 0;
static inline void qkcli_on_fsize(int sig) { (void)sig; qkcli_fsize_hit = 1; }
static inline void qkcli_catch_fsize(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = qkcli_on_fsize;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGXFSZ, &sa, NULL);
}
static inline void qkcli_fsize_note(char *buf, size_t size) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        snprintf(buf, size, "a write went past the file size limit (ulimit -f, RLIMIT_FSIZE: %llu bytes); "
                            "the temporary file was removed", (unsigned long long)rl.rlim_cur);
    else snprintf(buf, size, "a write went past the file size limit (SIGXFSZ); the temporary file was removed");
}

#endif /* QK_CLI_OPTIONS_H */
