/* src/cli/options.h — what qk-gram and qk-gram-mpi share of their command lines and messages:
   quoting a value in a message (qkcli_arg), writing a message with its bytes escaped
   (qkcli_put_msg), the monotonic clock, the case-blind extension test, splitting "--name=value",
   the values both take alike (--device, --precision, --tol), and catching SIGXFSZ. A parser
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
