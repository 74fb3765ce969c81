#include "qk_internal.h"
/* >>config ---- defaults, the allocator (the includes and config macros: qk_internal.h) ---- */

QK__PRIV int qk__def_i(int v, int d) { return v ? v : d; }
QK__PRIV double qk__def_d(double v, double d) { return v != 0.0 ? v : d; }

QK__PRIV void *qk__malloc(size_t n) { return QK_MALLOC(n ? n : 1); }
QK__PRIV void *qk__calloc(size_t count, size_t size)
{
    void *p;
    if (size && count > (size_t)-1 / size) return NULL;
    p = qk__malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}
QK__PRIV void *qk__realloc(void *p, size_t n) { return QK_REALLOC(p, n ? n : 1); }
QK__PRIV void qk__free(void *p) { QK_FREE(p); }
/* The context's own blocks: qk_ctx_desc.allocator where set, else the macros. */
QK__PRIV void *qk__alloc_with(const qk_allocator *a, size_t n) { return a && a->alloc ? a->alloc(n ? n : 1, a->user) : qk__malloc(n); }
QK__PRIV void qk__free_with(const qk_allocator *a, void *p)
{
    if (p && a && a->free) a->free(p, a->user);
    else qk__free(p);
}


/* >>errors ---- results, the detail message ---- */
/* Bytes of a file or of user text quoted in a message: printable ASCII as is, '\\' and
   control and non-ASCII bytes escaped (\n, \t, \r, \0, \xNN), at most max input bytes (then
   "..."). Returns buf. */
QK__PRIV const char *qk__esc(char *buf, size_t size, const char *s, size_t n, size_t max)
{
    size_t i, k = 0;
    int cut = 0;
    if (!size) return buf;
    for (i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        size_t el;
        if (c == '\\') { e[0] = '\\'; e[1] = '\\'; el = 2; }
        else if (c >= 0x20 && c < 0x7f) { e[0] = (char)c; el = 1; }
        else if (c == '\n') { e[0] = '\\'; e[1] = 'n'; el = 2; }
        else if (c == '\t') { e[0] = '\\'; e[1] = 't'; el = 2; }
        else if (c == '\r') { e[0] = '\\'; e[1] = 'r'; el = 2; }
        else if (c == 0) { e[0] = '\\'; e[1] = '0'; el = 2; }
        else { snprintf(e, sizeof e, "\\x%02x", c); el = 4; }
        if (k + el + 4 > size) { cut = 1; break; }   /* room for "..." and the NUL */
        memcpy(buf + k, e, el);
        k += el;
    }
    if ((cut || i < n) && k + 4 <= size) { memcpy(buf + k, "...", 3); k += 3; }
    buf[k] = 0;
    return buf;
}

/* A value the user gave (a path, a spec, an option's value) as a message quotes it: escaped by
   qk__esc, at most QK__ESC_ARG_MAX bytes of it, then "... (N bytes)": a 120000-byte spec is
   not echoed whole, an escape sequence in a file name does not reach the terminal. buf of
   QK__ESC_ARG_SIZE bytes holds any value. Returns buf. */
QK__PRIV const char *qk__esc_arg(char *buf, size_t size, const char *s)
{
    size_t n, k;
    if (!size) return buf;
    if (!s) { snprintf(buf, size, "(null)"); return buf; }
    n = strlen(s);
    qk__esc(buf, size > 24 ? size - 24 : size, s, n, QK__ESC_ARG_MAX);
    k = strlen(buf);
    if (n > QK__ESC_ARG_MAX && size > 24) snprintf(buf + k, size - k, " (%lu bytes)", (unsigned long)n);
    return buf;
}

/* A whole message with every byte that is not printable ASCII escaped by qk__esc, into dst (cut
   with "..." to fit size). A '\\' stays as it is: the message may quote text qk__esc has
   escaped already. The detail message goes through it (qk__set_errorv), so a value the
   message quotes raw (a path) cannot put control bytes on a terminal either. */
QK__PRIV void qk__esc_msg(char *dst, size_t size, const char *src)
{
    size_t k = 0;
    if (!size) return;
    for (; *src; src++) {
        unsigned char c = (unsigned char)*src;
        char e[8];
        size_t el;
        if (c >= 0x20 && c < 0x7f) { e[0] = (char)c; e[1] = 0; }
        else qk__esc(e, sizeof e, src, 1, 1);
        el = strlen(e);
        if (k + el + 4 > size) {   /* room for "..." and the NUL */
            if (k + 4 <= size) { memcpy(dst + k, "...", 3); k += 3; }
            break;
        }
        memcpy(dst + k, e, el);
        k += el;
    }
    dst[k] = 0;
}

QK__PRIV QK__TLS char qk__errbuf[512];


/* Every byte that is not printable ASCII in the message is escaped (qk__esc_msg): values are
   quoted escaped where they are formatted (qk__esc, qk__esc_arg), and anything quoted raw
   still reaches a terminal as text. */
static void qk__set_errorv(const char *fmt, va_list ap)
{
    char raw[sizeof qk__errbuf];
    vsnprintf(raw, sizeof raw, fmt, ap);
    qk__esc_msg(qk__errbuf, sizeof qk__errbuf, raw);
}

QK__PRIV void qk__set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qk__set_errorv(fmt, ap);
    va_end(ap);
}

/* Sets the detail message and returns r: `return qk__fail(QK_ERROR_SHAPE, "...", ...);` */
QK__PRIV qk_result qk__fail(qk_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qk__set_errorv(fmt, ap);
    va_end(ap);
    return r;
}

QKDEF const char *qk_result_string(qk_result r)
{
    switch (r) {
    case QK_OK: return "ok";
    case QK_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case QK_ERROR_NON_FINITE: return "non-finite input";
    case QK_ERROR_SHAPE: return "shape mismatch";
    case QK_ERROR_PARSE: return "map spec parse error";
    case QK_ERROR_TOO_MANY_QUBITS: return "too many qubits";
    case QK_ERROR_ZERO_NORM: return "zero norm";
    case QK_ERROR_BAD_DATA: return "data outside the map's domain";
    case QK_ERROR_OUT_OF_MEMORY: return "out of host memory";
    case QK_ERROR_IO: return "I/O error";
    case QK_ERROR_FORMAT: return "malformed file";
    case QK_ERROR_NO_DEVICE: return "no CUDA device";
    case QK_ERROR_CUDA: return "CUDA error";
    case QK_ERROR_DEVICE_OUT_OF_MEMORY: return "out of device memory";
    case QK_ERROR_CANCELLED: return "cancelled";
    case QK_ERROR_UNSUPPORTED: return "unsupported";
    default: return "unknown qk_result";
    }
}

QKDEF const char *qk_last_error(void) { return qk__errbuf; }

/* Precision names, the one table (qk_precision_name, qk_precision_parse) */
static const char *const qk__prec_names[QK_PRECISION_COUNT] = {"default", "fp32", "fp64", "tf32", "fp32x3", "fp16", "auto"};
QKDEF const char *qk_precision_name(qk_precision p)
{
    return (int)p >= 0 && (int)p < QK_PRECISION_COUNT ? qk__prec_names[p] : "?";
}
QKDEF qk_result qk_precision_parse(const char *s, qk_precision *out)
{
    int k;
    for (k = 0; s && k < QK_PRECISION_COUNT; k++)
        if (!strcmp(s, qk__prec_names[k])) {
            if (out) *out = (qk_precision)k;
            return out ? QK_OK : qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_precision_parse: NULL out");
        }
    return qk__fail(QK_ERROR_INVALID_ARGUMENT, "precision: %s is not one of auto, fp32, fp64, fp32x3, fp16, tf32, default",
                    s ? "the value given" : "NULL");
}
/* The modes whose output is float32 by default: all but DEFAULT, FP64 and AUTO. */
QK__PRIV int qk__prec_f32(qk_precision p) { return p != QK_PRECISION_DEFAULT && p != QK_PRECISION_FP64 && p != QK_PRECISION_AUTO; }
/* precision AUTO (and DEFAULT on the GPU engine): the fastest mode whose stated bound meets tol */


