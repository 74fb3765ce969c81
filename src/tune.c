#include "qk_internal.h"
/* >>tune_impl ---- the autotune cache (JSON) ---- */
/* The file (docs/autotune.md):
     {"schema": 1, "qk": "0.1.0", "entries": [{"device": "...", "cc_major": 9, ...}, ...]}
   It is shared by processes and users' tools and may be damaged, truncated or written by someone
   else, so the reader is strict and bounded: the whole text must be valid JSON (grammar, UTF-8,
   escapes), at most QK_TUNE_CACHE_MAX_BYTES, nested at most QK__TJ_MAX_DEPTH deep, with the
   schema and every entry valid, before any entry is used. Unknown keys are skipped so that a
   later schema-1 writer may add fields. Numbers are written and read with '.' whatever the C
   locale says (a host program may have called setlocale).
   Only programs that can tune carry this code: it is compiled where the CUDA engine is
   (QK_CUDA) or with QK_TUNE_CACHE (tests, tools that manage the cache). A CPU-only build has
   qk_tune_key_init and stubs that return QK_ERROR_UNSUPPORTED (no JSON reader or writer), and
   so has any build with QK_NO_TUNE (the GPU planner then takes the fixed table). */
#if ((defined(QK_CUDA) && QK_CUDA) || defined(QK_TUNE_CACHE)) && !defined(QK_NO_TUNE)
#define QK__TUNE_ON 1
#else
#define QK__TUNE_ON 0
#endif
#ifndef QK_TUNE_CACHE_MAX_ENTRIES
#define QK_TUNE_CACHE_MAX_ENTRIES 4096  /* ~300 bytes each: about 1 MiB of typical file */
#endif
#ifndef QK_TUNE_CACHE_MAX_BYTES
#define QK_TUNE_CACHE_MAX_BYTES (8 << 20) /* above the largest file the writer can produce */
#endif

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 when invalid (overlong forms,
   surrogates and code points above U+10FFFF are invalid, as RFC 3629 says). */
static size_t qk__utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0], cp, min;
    size_t len, i;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1Fu; min = 0x80; }
    else if ((c & 0xF0u) == 0xE0) { len = 3; cp = c & 0x0Fu; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07u; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (i = 1; i < len; i++) {
        if ((s[i] & 0xC0u) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Copies src into dst[cap] (truncating), then replaces bytes that are not valid UTF-8 by '?',
   so that every string the cache writes is valid JSON and compares the same after a reload. */
static void qk__tune_copy(char *dst, size_t cap, const char *src) {
    size_t n = 0, i = 0;
    if (src) {
        /* byte by byte: src may be shorter than cap (a literal), so no memcpy of cap - 1 */
        for (; n + 1 < cap && src[n]; n++) dst[n] = src[n];
    }
    memset(dst + n, 0, cap - n);
    while (i < n) {
        size_t k = qk__utf8_seq((const unsigned char *)dst + i, n - i);
        if (k == 0) { dst[i] = '?'; k = 1; }
        i += k;
    }
}

QKDEF void qk_tune_key_init(qk_tune_key *key, const char *device_name, int cc_major, int cc_minor,
                            int driver_version, const char *kernel, qk_path path,
                            qk_precision precision, int n_qubits) {
    if (!key) return;
    memset(key, 0, sizeof *key);
    qk__tune_copy(key->device, sizeof key->device, device_name);
    qk__tune_copy(key->qk_version, sizeof key->qk_version, QK_VERSION_STRING);
    qk__tune_copy(key->kernel, sizeof key->kernel, kernel && kernel[0] ? kernel : "gram");
    key->cc_major = cc_major;
    key->cc_minor = cc_minor;
    key->driver_version = driver_version;
    key->path = path;
    key->precision = precision;
    key->n_qubits = n_qubits;
}

#if QK__TUNE_ON
#define QK__TJ_MAX_DEPTH 32
#define QK__TUNE_PATH_MAX 4096

#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if !defined(_WIN32)
#define QK__TUNE_POSIX 1
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef O_CLOEXEC
#define QK__O_CLOEXEC O_CLOEXEC
#else
#define QK__O_CLOEXEC 0
#endif
#ifdef O_NOFOLLOW
#define QK__O_NOFOLLOW O_NOFOLLOW
#else
#define QK__O_NOFOLLOW 0
#endif
#endif

static const char *const qk__tune_path_names[] = {"?", "analytic", "real", "complex"};

/* A warning: to the log callback (if any) and to the detail message; returns r. */
static qk_result qk__tune_warn(qk_log_fn log, void *user, qk_result r, const char *fmt, ...) {
    char raw[1024], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    qk__esc_msg(msg, sizeof msg, raw);   /* a path with control bytes reaches the log as text */
    if (log) log(QK_LOG_WARN, msg, user);
    return qk__fail(r, "%s", msg);
}

static int qk__tune_key_eq(const qk_tune_key *a, const qk_tune_key *b) {
    return a->cc_major == b->cc_major && a->cc_minor == b->cc_minor &&
           a->driver_version == b->driver_version && a->path == b->path &&
           a->precision == b->precision && a->n_qubits == b->n_qubits &&
           strcmp(a->device, b->device) == 0 && strcmp(a->qk_version, b->qk_version) == 0 &&
           strcmp(a->kernel, b->kernel) == 0;
}

/* Validates a caller's key and writes its normal form to *k: defaults filled, strings made
   valid UTF-8, unused bytes zeroed. */
static qk_result qk__tune_key_norm(const qk_tune_key *in, qk_tune_key *k) {
    if (!memchr(in->device, 0, sizeof in->device))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.device is not NUL-terminated");
    if (!memchr(in->qk_version, 0, sizeof in->qk_version))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.qk_version is not NUL-terminated");
    if (!memchr(in->kernel, 0, sizeof in->kernel))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.kernel is not NUL-terminated");
    if ((int)in->path < (int)QK_PATH_ANALYTIC || (int)in->path > (int)QK_PATH_COMPLEX)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.path is %d", (int)in->path);
    if ((int)in->precision < (int)QK_PRECISION_DEFAULT || (int)in->precision >= QK_PRECISION_COUNT)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.precision is %d", (int)in->precision);
    if (in->n_qubits < 1 || in->n_qubits > QK_MAX_PRODUCT_QUBITS)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key.n_qubits is %d", in->n_qubits);
    memset(k, 0, sizeof *k);
    qk__tune_copy(k->device, sizeof k->device, in->device);
    qk__tune_copy(k->qk_version, sizeof k->qk_version, in->qk_version[0] ? in->qk_version : QK_VERSION_STRING);
    qk__tune_copy(k->kernel, sizeof k->kernel, in->kernel[0] ? in->kernel : "gram");
    k->cc_major = in->cc_major;
    k->cc_minor = in->cc_minor;
    k->driver_version = in->driver_version;
    k->path = in->path;
    k->precision = in->precision;
    k->n_qubits = in->n_qubits;
    return QK_OK;
}

/* -- JSON reader. Syntax errors stop it (bad, why); schema problems (sem, sem_why) are noted
   and parsing goes on, so that a syntactically fine file of a future schema is reported as such
   rather than as corrupt. -- */
typedef struct qk__tj {
    const unsigned char *s, *p, *end;
    int depth;
    int bad;
    char why[160];
    int sem;
    char sem_why[200];
} qk__tj;

static int qk__tj_err(qk__tj *j, const char *what) {
    if (!j->bad) {
        j->bad = 1;
        snprintf(j->why, sizeof j->why, "%s at byte %ld", what, (long)(j->p - j->s));
    }
    return 0;
}

static void qk__tj_sem(qk__tj *j, int entry, const char *what, const char *name) {
    if (j->sem) return;
    j->sem = 1;
    if (entry >= 0)
        snprintf(j->sem_why, sizeof j->sem_why, "entry %d: %s \"%.40s\"", entry, what, name);
    else
        snprintf(j->sem_why, sizeof j->sem_why, "%s \"%.40s\"", what, name);
}

static void qk__tj_ws(qk__tj *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* Consumes c (after white space) or fails with what. */
static int qk__tj_expect(qk__tj *j, unsigned char c, const char *what) {
    qk__tj_ws(j);
    if (j->p >= j->end || *j->p != c) return qk__tj_err(j, what);
    j->p++;
    return 1;
}

static int qk__tj_hex4(qk__tj *j, unsigned *out) {
    unsigned v = 0;
    int i;
    if (j->end - j->p < 4) return qk__tj_err(j, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        unsigned c = j->p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return qk__tj_err(j, "bad \\u escape");
        v = v * 16 + d;
    }
    j->p += 4;
    *out = v;
    return 1;
}

/* A string into out[cap] (NUL-terminated; out NULL: skipped). *fits = 0 when the decoded
   string does not fit or holds U+0000 (a C string cannot); out then holds a prefix. */
static int qk__tj_str(qk__tj *j, char *out, size_t cap, int *fits) {
    size_t n = 0;
    int ok = 1;
    qk__tj_ws(j);
    if (j->p >= j->end || *j->p != '"') return qk__tj_err(j, "expected a string");
    j->p++;
    for (;;) {
        unsigned char tmp[4];
        size_t tn = 1;
        unsigned c;
        if (j->p >= j->end) return qk__tj_err(j, "unterminated string");
        c = *j->p;
        if (c == '"') { j->p++; break; }
        if (c < 0x20) return qk__tj_err(j, "control character in a string");
        if (c == '\\') {
            if (j->end - j->p < 2) return qk__tj_err(j, "unterminated string");
            c = j->p[1];
            j->p += 2;
            switch (c) {
            case '"': case '\\': case '/': tmp[0] = (unsigned char)c; break;
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'n': tmp[0] = '\n'; break;
            case 'r': tmp[0] = '\r'; break;
            case 't': tmp[0] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (!qk__tj_hex4(j, &cp)) return 0;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return qk__tj_err(j, "lone low surrogate");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                        return qk__tj_err(j, "lone high surrogate");
                    j->p += 2;
                    if (!qk__tj_hex4(j, &lo)) return 0;
                    if (lo < 0xDC00 || lo > 0xDFFF) return qk__tj_err(j, "bad surrogate pair");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) ok = 0;
                if (cp < 0x80) { tmp[0] = (unsigned char)cp; }
                else if (cp < 0x800) {
                    tmp[0] = (unsigned char)(0xC0 | (cp >> 6));
                    tmp[1] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 2;
                } else if (cp < 0x10000) {
                    tmp[0] = (unsigned char)(0xE0 | (cp >> 12));
                    tmp[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[2] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 3;
                } else {
                    tmp[0] = (unsigned char)(0xF0 | (cp >> 18));
                    tmp[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                    tmp[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[3] = (unsigned char)(0x80 | (cp & 0x3F)); tn = 4;
                }
                break;
            }
            default: j->p--; return qk__tj_err(j, "bad escape");
            }
        } else if (c < 0x80) {
            tmp[0] = (unsigned char)c;
            j->p++;
        } else {
            tn = qk__utf8_seq(j->p, (size_t)(j->end - j->p));
            if (tn == 0) return qk__tj_err(j, "invalid UTF-8");
            memcpy(tmp, j->p, tn);
            j->p += tn;
        }
        if (out) {
            if (ok && n + tn < cap) { memcpy(out + n, tmp, tn); n += tn; }
            else ok = 0;
        }
    }
    if (out && cap) out[n] = 0;
    if (fits) *fits = ok;
    return 1;
}

/* A number (JSON grammar, at most 40 characters). *is_int: no fraction or exponent and it fits
   an int64 (*iv). */
static int qk__tj_num(qk__tj *j, double *d, int64_t *iv, int *is_int) {
    const unsigned char *b, *q;
    char buf[80], *endp;
    const char *dp;
    size_t n, dpl, i, k = 0;
    int integer = 1, neg = 0;
    uint64_t u = 0;
    qk__tj_ws(j);
    b = q = j->p;
    if (q < j->end && *q == '-') { q++; neg = 1; }
    if (q >= j->end) return qk__tj_err(j, "truncated number");
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') { while (q < j->end && *q >= '0' && *q <= '9') q++; }
    else return qk__tj_err(j, "unexpected character");
    if (q < j->end && *q == '.') {
        q++;
        integer = 0;
        if (q >= j->end || *q < '0' || *q > '9') return qk__tj_err(j, "bad number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        q++;
        integer = 0;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return qk__tj_err(j, "bad number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    n = (size_t)(q - b);
    if (n > 40) return qk__tj_err(j, "number too long");
    /* strtod reads the locale's decimal point, so '.' becomes that. */
    dp = localeconv()->decimal_point;
    dpl = dp ? strlen(dp) : 0;
    if (dpl == 0 || dpl > 8) { dp = "."; dpl = 1; }
    for (i = 0; i < n; i++) {
        if (b[i] == '.') { memcpy(buf + k, dp, dpl); k += dpl; }
        else buf[k++] = (char)b[i];
    }
    buf[k] = 0;
    *d = strtod(buf, &endp);
    if (*endp) return qk__tj_err(j, "bad number");
    if (integer) {
        for (i = (size_t)neg; i < n && integer; i++) {
            unsigned dig = (unsigned)(b[i] - '0');
            if (u > (UINT64_MAX - dig) / 10) integer = 0;
            else u = u * 10 + dig;
        }
        if (u > (uint64_t)INT64_MAX + (uint64_t)neg) integer = 0;
        if (integer) *iv = neg ? (u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u) : (int64_t)u;
    }
    *is_int = integer;
    j->p = q;
    return 1;
}

static int qk__tj_lit(qk__tj *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return qk__tj_err(j, "unexpected character");
    j->p += n;
    return 1;
}

/* Skips any value (validating it). */
static int qk__tj_skip(qk__tj *j) {
    double d;
    int64_t iv;
    int isi;
    qk__tj_ws(j);
    if (j->p >= j->end) return qk__tj_err(j, "unexpected end");
    switch (*j->p) {
    case '{': case '[': {
        unsigned char close = *j->p == '{' ? '}' : ']';
        int obj = close == '}';
        if (++j->depth > QK__TJ_MAX_DEPTH) return qk__tj_err(j, "nested too deeply");
        j->p++;
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; j->depth--; return 1; }
        for (;;) {
            if (obj && (!qk__tj_str(j, NULL, 0, NULL) || !qk__tj_expect(j, ':', "expected ':'"))) return 0;
            if (!qk__tj_skip(j)) return 0;
            qk__tj_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            if (j->p < j->end && *j->p == close) { j->p++; break; }
            return qk__tj_err(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        j->depth--;
        return 1;
    }
    case '"': return qk__tj_str(j, NULL, 0, NULL);
    case 't': return qk__tj_lit(j, "true");
    case 'f': return qk__tj_lit(j, "false");
    case 'n': return qk__tj_lit(j, "null");
    default: return qk__tj_num(j, &d, &iv, &isi);
    }
}

/* Field names of an entry, in the order the writer writes them (QK__TF_* index them). */
static const char *const qk__tune_fields[] = {
    "device", "cc_major", "cc_minor", "driver", "qk", "kernel", "path", "precision", "qubits",
    "config", "metric", "timestamp"};
enum {
    QK__TF_DEVICE, QK__TF_CC_MAJOR, QK__TF_CC_MINOR, QK__TF_DRIVER, QK__TF_QK, QK__TF_KERNEL,
    QK__TF_PATH, QK__TF_PRECISION, QK__TF_QUBITS, QK__TF_CONFIG, QK__TF_METRIC, QK__TF_TIMESTAMP,
    QK__TUNE_NFIELDS
};

/* The string value of field f into *e. 0 on a syntax error; *ok = 0 when it breaks the schema
   (noted in j->sem_why). */
static int qk__tj_field_str(qk__tj *j, int index, int f, const char *name, qk_tune_entry *e, int *ok) {
    char sval[128];
    int fits, k;
    if (!qk__tj_str(j, sval, sizeof sval, &fits)) return 0;
    if (!fits) {
        qk__tj_sem(j, index, "string too long or holding NUL:", name);
        *ok = 0;
        return 1;
    }
    switch (f) {
    case QK__TF_DEVICE:
        qk__tune_copy(e->key.device, sizeof e->key.device, sval);
        break;
    case QK__TF_CONFIG:
        if (strlen(sval) >= sizeof e->config || !sval[0]) { qk__tj_sem(j, index, "bad length:", name); *ok = 0; }
        else qk__tune_copy(e->config, sizeof e->config, sval);
        break;
    case QK__TF_QK:
    case QK__TF_KERNEL: {
        char *dst = f == QK__TF_QK ? e->key.qk_version : e->key.kernel;
        size_t cap = f == QK__TF_QK ? sizeof e->key.qk_version : sizeof e->key.kernel;
        if (strlen(sval) >= cap) { qk__tj_sem(j, index, "too long:", name); *ok = 0; }
        else qk__tune_copy(dst, cap, sval);
        break;
    }
    case QK__TF_PATH:
        for (k = 1; k <= 3 && strcmp(sval, qk__tune_path_names[k]) != 0; k++) {}
        if (k > 3) { qk__tj_sem(j, index, "unknown path", sval); *ok = 0; }
        else e->key.path = (qk_path)k;
        break;
    default: /* QK__TF_PRECISION */
        for (k = 0; k < QK_PRECISION_COUNT && strcmp(sval, qk_precision_name((qk_precision)k)) != 0; k++) {}
        if (k >= QK_PRECISION_COUNT) { qk__tj_sem(j, index, "unknown precision", sval); *ok = 0; }
        else e->key.precision = (qk_precision)k;
        break;
    }
    return 1;
}

/* The number value of field f into *e (as qk__tj_field_str). */
static int qk__tj_field_num(qk__tj *j, int index, int f, const char *name, qk_tune_entry *e, int *ok) {
    double d = 0;
    int64_t iv = 0;
    int isi = 0;
    if (!qk__tj_num(j, &d, &iv, &isi)) return 0;
    if (f == QK__TF_METRIC) {
        if (!(d - d == 0.0)) { qk__tj_sem(j, index, "not finite:", name); *ok = 0; }
        e->metric = d;
    } else if (!isi) {
        qk__tj_sem(j, index, "not an integer:", name);
        *ok = 0;
    } else if (f == QK__TF_TIMESTAMP) {
        e->timestamp = iv;
    } else if (iv < -2147483647 - 1 || iv > 2147483647 ||
               (f == QK__TF_QUBITS && (iv < 1 || iv > QK_MAX_PRODUCT_QUBITS))) {
        qk__tj_sem(j, index, "out of range:", name);
        *ok = 0;
    } else if (f == QK__TF_CC_MAJOR) e->key.cc_major = (int)iv;
    else if (f == QK__TF_CC_MINOR) e->key.cc_minor = (int)iv;
    else if (f == QK__TF_DRIVER) e->key.driver_version = (int)iv;
    else e->key.n_qubits = (int)iv;
    return 1;
}

/* The value of member name (fits: the name was read whole) of entry index: a known field once
   and of its type, or an unknown key, skipped (a field of a later writer). 0 on a syntax error. */
static int qk__tj_field(qk__tj *j, int index, const char *name, int fits, unsigned *seen, qk_tune_entry *e,
                        int *ok) {
    int f, is_str;
    for (f = 0; fits && f < QK__TUNE_NFIELDS; f++)
        if (strcmp(name, qk__tune_fields[f]) == 0) break;
    qk__tj_ws(j);
    if (!fits || f == QK__TUNE_NFIELDS) return qk__tj_skip(j);
    is_str = f == QK__TF_DEVICE || f == QK__TF_QK || f == QK__TF_KERNEL || f == QK__TF_PATH ||
             f == QK__TF_PRECISION || f == QK__TF_CONFIG;
    if (*seen & (1u << f)) { qk__tj_sem(j, index, "duplicate field", name); *ok = 0; }
    *seen |= 1u << f;
    if (j->p < j->end && (is_str ? *j->p != '"' : !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))) {
        qk__tj_sem(j, index, is_str ? "not a string:" : "not a number:", name);
        *ok = 0;
        return qk__tj_skip(j);
    }
    return is_str ? qk__tj_field_str(j, index, f, name, e, ok) : qk__tj_field_num(j, index, f, name, e, ok);
}

/* One entry object (j->p at '{') into *e; *valid = 0 when it breaks the schema. 0 on a syntax
   error. */
static int qk__tj_entry(qk__tj *j, int index, qk_tune_entry *e, int *valid) {
    unsigned seen = 0;
    int f, ok = 1;
    memset(e, 0, sizeof *e);
    *valid = 0;
    if (++j->depth > QK__TJ_MAX_DEPTH) return qk__tj_err(j, "nested too deeply");
    j->p++; /* '{' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == '}') j->p++;
    else for (;;) {
        char name[16];
        int fits;
        if (!qk__tj_str(j, name, sizeof name, &fits) || !qk__tj_expect(j, ':', "expected ':'")) return 0;
        if (!qk__tj_field(j, index, name, fits, &seen, e, &ok)) return 0;
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; break; }
        return qk__tj_err(j, "expected ',' or '}'");
    }
    j->depth--;
    for (f = 0; f < QK__TUNE_NFIELDS; f++)
        if (!(seen & (1u << f))) { qk__tj_sem(j, index, "missing field", qk__tune_fields[f]); ok = 0; break; }
    if (ok) {
        if (!e->key.qk_version[0]) qk__tune_copy(e->key.qk_version, sizeof e->key.qk_version, QK_VERSION_STRING);
        if (!e->key.kernel[0]) qk__tune_copy(e->key.kernel, sizeof e->key.kernel, "gram");
    }
    *valid = ok;
    return 1;
}

/* Appends *e to the entries (*v: n of cap, QK_MALLOC'ed); beyond QK_TUNE_CACHE_MAX_ENTRIES
   entries are dropped. 0 when out of memory. */
static int qk__tune_push(qk_tune_entry **v, int *n, int *cap, const qk_tune_entry *e) {
    if (*n >= QK_TUNE_CACHE_MAX_ENTRIES) return 1;
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        qk_tune_entry *nv;
        if (nc > QK_TUNE_CACHE_MAX_ENTRIES) nc = QK_TUNE_CACHE_MAX_ENTRIES;
        nv = (qk_tune_entry *)QK_MALLOC((size_t)nc * sizeof *nv);
        if (!nv) return 0;
        if (*n) memcpy(nv, *v, (size_t)*n * sizeof *nv);
        QK_FREE(*v);
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = *e;
    return 1;
}

/* The "entries" array (j->p at '['): every element validated, the valid entries appended.
   1; 0 on a syntax error; -1 when out of memory. */
static int qk__tj_entries(qk__tj *j, qk_tune_entry **v, int *n, int *cap) {
    qk_tune_entry e;
    int index = 0, valid;
    j->depth++;
    j->p++; /* '[' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == ']') j->p++;
    else for (;;) {
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == '{') {
            if (!qk__tj_entry(j, index, &e, &valid)) return 0;
            if (valid && !qk__tune_push(v, n, cap, &e)) return -1;
        } else {
            qk__tj_sem(j, -1, "not an object:", "entries[]");
            if (!qk__tj_skip(j)) return 0;
        }
        index++;
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == ']') { j->p++; break; }
        return qk__tj_err(j, "expected ',' or ']'");
    }
    j->depth--;
    return 1;
}

/* What the root object said about itself. */
typedef struct qk__tj_root {
    int have_schema, schema_int, have_entries;
    int64_t schema;
} qk__tj_root;

/* The root object's members (j->p at '{'): "schema", "entries" (into *v), others skipped.
   1; 0 on a syntax error; -1 when out of memory. */
static int qk__tj_root_members(qk__tj *j, qk__tj_root *rt, qk_tune_entry **v, int *n, int *cap) {
    j->depth = 1;
    j->p++; /* '{' */
    qk__tj_ws(j);
    if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
    for (;;) {
        char name[16];
        int fits;
        if (!qk__tj_str(j, name, sizeof name, &fits) || !qk__tj_expect(j, ':', "expected ':'")) return 0;
        qk__tj_ws(j);
        if (fits && strcmp(name, "schema") == 0) {
            double d;
            if (rt->have_schema) qk__tj_sem(j, -1, "duplicate key", name);
            rt->have_schema = 1;
            if (j->p < j->end && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) {
                if (!qk__tj_num(j, &d, &rt->schema, &rt->schema_int)) return 0;
            } else if (!qk__tj_skip(j)) return 0;
        } else if (fits && strcmp(name, "entries") == 0) {
            if (rt->have_entries) qk__tj_sem(j, -1, "duplicate key", name);
            rt->have_entries = 1;
            if (j->p >= j->end || *j->p != '[') {
                qk__tj_sem(j, -1, "not an array:", name);
                if (!qk__tj_skip(j)) return 0;
            } else {
                int r = qk__tj_entries(j, v, n, cap);
                if (r <= 0) return r;
            }
        } else {
            if (fits && strcmp(name, "qk") == 0 && (j->p >= j->end || *j->p != '"'))
                qk__tj_sem(j, -1, "not a string:", name);
            if (!qk__tj_skip(j)) return 0;
        }
        qk__tj_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == '}') { j->p++; return 1; }
        return qk__tj_err(j, "expected ',' or '}'");
    }
}

/* The verdict on a whole file once read (not_object: its root is not an object): 1 when it is a
   cache of this schema with no error; else 0, and why says the first thing wrong, syntax first. */
static int qk__tj_verdict(const qk__tj *j, const qk__tj_root *rt, int not_object, char *why, size_t why_size) {
    if (j->bad) snprintf(why, why_size, "corrupt or truncated (%s)", j->why);
    else if (not_object) snprintf(why, why_size, "not a qk autotune cache (not a JSON object)");
    else if (!rt->have_schema) snprintf(why, why_size, "not a qk autotune cache (no \"schema\")");
    else if (!rt->schema_int) snprintf(why, why_size, "not a qk autotune cache (\"schema\" is not an integer)");
    else if (rt->schema > QK_TUNE_SCHEMA)
        snprintf(why, why_size, "written by a newer qk (schema %lld; this qk reads %d)", (long long)rt->schema, QK_TUNE_SCHEMA);
    else if (rt->schema != QK_TUNE_SCHEMA)
        snprintf(why, why_size, "unknown schema %lld (this qk reads %d)", (long long)rt->schema, QK_TUNE_SCHEMA);
    else if (!rt->have_entries) snprintf(why, why_size, "not a qk autotune cache (no \"entries\")");
    else if (j->sem) snprintf(why, why_size, "corrupt (%s)", j->sem_why);
    else return 1;
    return 0;
}

/* Parses a cache file's text (len bytes, no terminator needed). QK_OK: *out (QK_MALLOC'ed, NULL
   when *n_out is 0) holds the entries, at most QK_TUNE_CACHE_MAX_ENTRIES (later ones are
   validated and dropped). QK_ERROR_FORMAT: why says what is wrong (corrupt / not a qk cache /
   future schema). QK_ERROR_OUT_OF_MEMORY. */
static qk_result qk__tune_parse(const char *text, size_t len, qk_tune_entry **out, int *n_out,
                                char *why, size_t why_size) {
    qk__tj j;
    qk__tj_root rt;
    qk_tune_entry *v = NULL;
    int n = 0, cap = 0, not_object = 0, r = 1;
    *out = NULL;
    *n_out = 0;
    memset(&j, 0, sizeof j);
    memset(&rt, 0, sizeof rt);
    j.s = j.p = (const unsigned char *)text;
    j.end = j.s + len;
    if (len > (size_t)QK_TUNE_CACHE_MAX_BYTES) {
        snprintf(why, why_size, "corrupt (larger than %ld bytes)", (long)QK_TUNE_CACHE_MAX_BYTES);
        return QK_ERROR_FORMAT;
    }
    qk__tj_ws(&j);
    if (j.p >= j.end) {
        snprintf(why, why_size, "corrupt (empty)");
        return QK_ERROR_FORMAT;
    }
    if (*j.p != '{') {
        not_object = 1;
        qk__tj_skip(&j);
    } else {
        r = qk__tj_root_members(&j, &rt, &v, &n, &cap);
    }
    if (r < 0) {
        QK_FREE(v);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory");
    }
    if (!j.bad) {
        qk__tj_ws(&j);
        if (j.p != j.end) qk__tj_err(&j, "trailing characters");
    }
    if (!qk__tj_verdict(&j, &rt, not_object, why, why_size)) {
        QK_FREE(v);
        return QK_ERROR_FORMAT;
    }
    *out = v;
    *n_out = n;
    return QK_OK;
}

/* -- JSON writer -- */
typedef struct qk__tbuf {
    char *p;
    size_t len, cap;
    int oom;
} qk__tbuf;

static void qk__tb_put(qk__tbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        char *np;
        while (nc < b->len + n + 1) nc *= 2;
        np = (char *)QK_MALLOC(nc);
        if (!np) { b->oom = 1; return; }
        if (b->len) memcpy(np, b->p, b->len);
        QK_FREE(b->p);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void qk__tb_s(qk__tbuf *b, const char *s) { qk__tb_put(b, s, strlen(s)); }

static void qk__tb_int(qk__tbuf *b, long long v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    qk__tb_s(b, t);
}

/* A JSON string; s is valid UTF-8 (qk__tune_copy made it so). */
static void qk__tb_str(qk__tbuf *b, const char *s) {
    qk__tb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char t[8];
        if (c == '"') qk__tb_put(b, "\\\"", 2);
        else if (c == '\\') qk__tb_put(b, "\\\\", 2);
        else if (c == '\n') qk__tb_put(b, "\\n", 2);
        else if (c == '\t') qk__tb_put(b, "\\t", 2);
        else if (c < 0x20) { snprintf(t, sizeof t, "\\u%04x", c); qk__tb_put(b, t, 6); }
        else qk__tb_put(b, s, 1);
    }
    qk__tb_put(b, "\"", 1);
}

/* The shortest of %.15g..%.17g that reads back exactly, with '.' as the decimal point. */
static void qk__tb_double(qk__tbuf *b, double v) {
    char t[64], *hit;
    const char *dp = localeconv()->decimal_point;
    size_t dpl = dp ? strlen(dp) : 0;
    int prec;
    for (prec = 15; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v) break;
    }
    if (dpl && !(dpl == 1 && dp[0] == '.') && (hit = strstr(t, dp)) != NULL) {
        *hit = '.';
        memmove(hit + 1, hit + dpl, strlen(hit + dpl) + 1);
    }
    qk__tb_s(b, t);
}

/* The whole file for n entries; 0 when out of memory. */
static int qk__tune_format(const qk_tune_entry *v, int n, qk__tbuf *b) {
    int i;
    qk__tb_s(b, "{\n  \"schema\": ");
    qk__tb_int(b, QK_TUNE_SCHEMA);
    qk__tb_s(b, ",\n  \"qk\": \"" QK_VERSION_STRING "\",\n  \"entries\": [");
    for (i = 0; i < n; i++) {
        const qk_tune_entry *e = &v[i];
        qk__tb_s(b, i ? ",\n    {\"device\": " : "\n    {\"device\": ");
        qk__tb_str(b, e->key.device);
        qk__tb_s(b, ", \"cc_major\": "); qk__tb_int(b, e->key.cc_major);
        qk__tb_s(b, ", \"cc_minor\": "); qk__tb_int(b, e->key.cc_minor);
        qk__tb_s(b, ", \"driver\": "); qk__tb_int(b, e->key.driver_version);
        qk__tb_s(b, ", \"qk\": "); qk__tb_str(b, e->key.qk_version);
        qk__tb_s(b, ", \"kernel\": "); qk__tb_str(b, e->key.kernel);
        qk__tb_s(b, ", \"path\": "); qk__tb_str(b, qk__tune_path_names[e->key.path]);
        qk__tb_s(b, ", \"precision\": "); qk__tb_str(b, qk_precision_name(e->key.precision));
        qk__tb_s(b, ", \"qubits\": "); qk__tb_int(b, e->key.n_qubits);
        qk__tb_s(b, ", \"config\": "); qk__tb_str(b, e->config);
        qk__tb_s(b, ", \"metric\": "); qk__tb_double(b, e->metric);
        qk__tb_s(b, ", \"timestamp\": "); qk__tb_int(b, (long long)e->timestamp);
        qk__tb_s(b, "}");
    }
    qk__tb_s(b, n ? "\n  ]\n}\n" : "]\n}\n");
    return !b->oom;
}

QKDEF qk_result qk_tune_cache_path(const char *dir_override, char *buf, size_t size) {
    const char *d = NULL, *sub = "", *e;
    size_t dl;
    int n;
    if (!buf || size == 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: no buffer");
    buf[0] = 0;
    if (dir_override && dir_override[0]) d = dir_override;
    else if ((e = getenv("QK_CACHE_DIR")) != NULL && e[0]) d = e;
    else if ((e = getenv("XDG_CACHE_HOME")) != NULL && e[0] == '/') { d = e; sub = "/qk"; }
    else if ((e = getenv("HOME")) != NULL && e[0]) { d = e; sub = "/.cache/qk"; }
    else return qk__fail(QK_ERROR_IO, "autotune cache: no directory (set QK_CACHE_DIR, XDG_CACHE_HOME or HOME)");
    dl = strlen(d);
    while (dl > 1 && d[dl - 1] == '/') dl--;  /* "dir/" gives "dir/autotune.json", not "dir//..." */
    if (dl == 1 && d[0] == '/' && !sub[0]) dl = 0;
    n = snprintf(buf, size, "%.*s%s/autotune.json", (int)dl, d, sub);
    if (n < 0 || (size_t)n >= size) {
        buf[0] = 0;
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: path needs %d bytes, buffer has %lu",
                        n + 1, (unsigned long)size);
    }
    return QK_OK;
}

#if defined(QK__TUNE_POSIX)
/* What a path that is not a regular file is, for a warning. */
static const char *qk__tune_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
#ifdef S_ISBLK
    if (S_ISBLK(m)) return "a block device";
#endif
#ifdef S_ISSOCK
    if (S_ISSOCK(m)) return "a socket";
#endif
    return "a special file";
}

/* Reads the file at path. QK_OK: *text (QK_MALLOC'ed, *len bytes); QK_ERROR_IO with *err_no (a
   directory: EISDIR); QK_ERROR_FORMAT (too large, or not a regular file: why). Only a regular
   file is read: the path is stat()ed first (a device is never opened), then opened without
   blocking (a FIFO would block in open() until a writer comes, forever) and fstat()ed again.
   A symbolic link is followed (no O_NOFOLLOW): a cache file kept elsewhere and linked is read,
   and reading through a link writes nothing; a store replaces the link by a file (rename). */
static qk_result qk__tune_slurp(const char *path, char **text, size_t *len, int *err_no, char *why,
                                size_t why_size) {
    struct stat st;
    char *buf;
    size_t cap, n = 0;
    int fd;
    *text = NULL;
    *len = 0;
    *err_no = 0;
    if (stat(path, &st) != 0) { *err_no = errno; return QK_ERROR_IO; }
    if (S_ISDIR(st.st_mode)) { *err_no = EISDIR; return QK_ERROR_IO; }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "it is %s, not a regular file", qk__tune_kind(st.st_mode));
        return QK_ERROR_FORMAT;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | QK__O_CLOEXEC);
    if (fd < 0) { *err_no = errno; return QK_ERROR_IO; }
    if (fstat(fd, &st) != 0) { *err_no = errno; close(fd); return QK_ERROR_IO; }
    if (S_ISDIR(st.st_mode)) { *err_no = EISDIR; close(fd); return QK_ERROR_IO; }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, why_size, "it is %s, not a regular file", qk__tune_kind(st.st_mode));
        return QK_ERROR_FORMAT;
    }
    if (st.st_size > (off_t)QK_TUNE_CACHE_MAX_BYTES) {
        close(fd);
        snprintf(why, why_size, "corrupt (larger than %ld bytes)", (long)QK_TUNE_CACHE_MAX_BYTES);
        return QK_ERROR_FORMAT;
    }
    /* One byte more than the size: a file that grew is seen as too large, not cut short. */
    cap = (size_t)st.st_size + 2;
    buf = (char *)QK_MALLOC(cap);
    if (!buf) { close(fd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory"); }
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { *err_no = errno; close(fd); QK_FREE(buf); return QK_ERROR_IO; }
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            close(fd);
            QK_FREE(buf);
            snprintf(why, why_size, "changed while being read (not written by qk?)");
            return QK_ERROR_FORMAT;
        }
    }
    close(fd);
    *text = buf;
    *len = n;
    return QK_OK;
}

/* Reads and parses the file. QK_OK; QK_ERROR_IO (*err_no; ENOENT: no file yet);
   QK_ERROR_FORMAT (why); QK_ERROR_OUT_OF_MEMORY. */
static qk_result qk__tune_load(const char *path, qk_tune_entry **v, int *n, int *err_no, char *why,
                               size_t why_size) {
    char *text;
    size_t len;
    qk_result r = qk__tune_slurp(path, &text, &len, err_no, why, why_size);
    *v = NULL;
    *n = 0;
    if (r != QK_OK) return r;
    r = qk__tune_parse(text, len, v, n, why, why_size);
    QK_FREE(text);
    return r;
}

QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    char pbuf[QK__TUNE_PATH_MAX], why[256];
    qk_tune_key k;
    qk_tune_entry *v;
    int n, i, err_no;
    qk_result r;
    if (!key || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: key or out is NULL");
    if ((r = qk__tune_key_norm(key, &k)) != QK_OK) return r;
    if (!path) {
        if (qk_tune_cache_path(NULL, pbuf, sizeof pbuf) != QK_OK)
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "%s; no autotune cache", qk_last_error());
        path = pbuf;
    }
    why[0] = 0;
    r = qk__tune_load(path, &v, &n, &err_no, why, sizeof why);
    if (r == QK_ERROR_IO && err_no == ENOENT)
        return qk__fail(QK_ERROR_IO, "autotune cache: %s does not exist yet", path);
    if (r == QK_ERROR_IO)
        return qk__tune_warn(log, log_user, r, "autotune cache: cannot read %s: %s; not using it", path,
                             strerror(err_no));
    if (r == QK_ERROR_FORMAT)
        return qk__tune_warn(log, log_user, r, "autotune cache: ignoring %s: %s; the next store rewrites it",
                             path, why);
    if (r != QK_OK) return r;
    for (i = n - 1; i >= 0; i--)
        if (qk__tune_key_eq(&v[i].key, &k)) break;
    if (i >= 0) *out = v[i];
    QK_FREE(v);
    if (i < 0)
        return qk__fail(QK_ERROR_IO, "autotune cache: no entry for %s %s %s q=%d on \"%s\" (cc %d.%d, driver %d, qk %s) in %s",
                        k.kernel, qk__tune_path_names[k.path], qk_precision_name(k.precision), k.n_qubits,
                        k.device, k.cc_major, k.cc_minor, k.driver_version, k.qk_version, path);
    return QK_OK;
}

/* mkdir -p; 0 or an errno. */
static int qk__tune_mkdirs(char *dir) {
    struct stat st;
    char *q;
    if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    for (q = dir + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) { int e = errno; *q = '/'; return e; }
        *q = '/';
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return errno;
    if (stat(dir, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    char pbuf[QK__TUNE_PATH_MAX], dir[QK__TUNE_PATH_MAX], lockp[QK__TUNE_PATH_MAX + 8], why[256];
    qk_tune_entry e, *v = NULL;
    qk__tbuf b;
    const char *slash;
    int n = 0, i, err_no, lfd, newest;
    size_t pl;
    qk_result r;
    if (!entry) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: entry is NULL");
    memset(&e, 0, sizeof e);
    if ((r = qk__tune_key_norm(&entry->key, &e.key)) != QK_OK) return r;
    if (!memchr(entry->config, 0, sizeof entry->config) || !entry->config[0])
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: config is empty or not NUL-terminated");
    if (!(entry->metric - entry->metric == 0.0))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune cache: metric is not finite");
    qk__tune_copy(e.config, sizeof e.config, entry->config);
    e.metric = entry->metric;
    e.timestamp = entry->timestamp ? entry->timestamp : (int64_t)time(NULL);
    if (!path) {
        if (qk_tune_cache_path(NULL, pbuf, sizeof pbuf) != QK_OK)
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "%s; no autotune cache", qk_last_error());
        path = pbuf;
    }
    pl = strlen(path);
    if (pl == 0 || pl >= QK__TUNE_PATH_MAX)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: path is empty or too long; no cache");
    slash = strrchr(path, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    if ((err_no = qk__tune_mkdirs(dir)) != 0)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot create directory %s: %s; no cache",
                             dir, strerror(err_no));

    /* Other processes (and threads: flock locks belong to this open file description) wait
       here, so no update is lost; readers do not lock: they see the old or the new file. */
    /* The lock is opened as the file is read: without blocking (a FIFO), without following a
       symbolic link (O_CREAT would create its target anywhere), and used only when it is a
       regular file. */
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    lfd = open(lockp, O_RDWR | O_CREAT | O_NONBLOCK | O_NOCTTY | QK__O_NOFOLLOW | QK__O_CLOEXEC, 0666);
    if (lfd < 0 && errno == ELOOP)
        return qk__tune_warn(log, log_user, QK_ERROR_IO,
                             "autotune cache: cannot use %s: it is a symbolic link (remove it); no cache", lockp);
    if (lfd < 0)
        return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot write %s: %s; no cache", lockp,
                             strerror(errno));
    {
        struct stat lst;
        if (fstat(lfd, &lst) != 0) {
            int e = errno;
            close(lfd);
            return qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot use %s: %s; no cache",
                                 lockp, strerror(e));
        }
        if (!S_ISREG(lst.st_mode)) {
            close(lfd);
            return qk__tune_warn(log, log_user, QK_ERROR_IO,
                                 "autotune cache: cannot use %s: it is %s (remove it); no cache", lockp,
                                 qk__tune_kind(lst.st_mode));
        }
    }
    while (flock(lfd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        /* A file system without locks: the rename below still keeps the file whole. */
        qk__tune_warn(log, log_user, QK_ERROR_IO, "autotune cache: cannot lock %s: %s; writing without the lock",
                      lockp, strerror(errno));
        break;
    }

    why[0] = 0;
    r = qk__tune_load(path, &v, &n, &err_no, why, sizeof why);
    if (r == QK_ERROR_OUT_OF_MEMORY) { close(lfd); return r; }
    if (r == QK_ERROR_FORMAT)
        qk__tune_warn(log, log_user, r, "autotune cache: ignoring %s: %s; rewriting it", path, why);
    else if (r == QK_ERROR_IO && err_no != ENOENT)
        qk__tune_warn(log, log_user, r, "autotune cache: cannot read %s: %s; rewriting it", path, strerror(err_no));

    /* Merge: replace the entry of the same key (and drop duplicates a hand edit left), or add. */
    newest = -1;
    for (i = 0; i < n; i++) {
        if (!qk__tune_key_eq(&v[i].key, &e.key)) continue;
        if (newest < 0) { v[i] = e; newest = i; }
        else { memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v); n--; i--; }
    }
    if (newest < 0) {
        qk_tune_entry *nv = (qk_tune_entry *)QK_MALLOC((size_t)(n + 1) * sizeof *nv);
        if (!nv) { QK_FREE(v); close(lfd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory"); }
        if (n) memcpy(nv, v, (size_t)n * sizeof *nv);
        QK_FREE(v);
        v = nv;
        v[n] = e;
        newest = n++;
    }
    while (n > QK_TUNE_CACHE_MAX_ENTRIES) {  /* evict the oldest, never the one just stored */
        int old = newest == 0 ? 1 : 0;
        for (i = 0; i < n; i++)
            if (i != newest && v[i].timestamp < v[old].timestamp) old = i;
        memmove(v + old, v + old + 1, (size_t)(n - old - 1) * sizeof *v);
        if (old < newest) newest--;
        n--;
    }
    memset(&b, 0, sizeof b);
    if (!qk__tune_format(v, n, &b)) {
        QK_FREE(v);
        QK_FREE(b.p);
        close(lfd);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "autotune cache: out of memory");
    }
    QK_FREE(v);

    /* temporary file in the same directory, fsync, rename, fsync of the directory (npy section) */
    r = qk__write_file_atomic(path, b.p, b.len, NULL, 0);
    if (r == QK_ERROR_IO)
        r = qk__tune_warn(log, log_user, r, "autotune cache: %s; not updated", qk_last_error());
    QK_FREE(b.p);
    close(lfd);  /* releases the lock */
    return r;
}
#else
QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    (void)path; (void)key; (void)out; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, "autotune cache: not implemented on this platform");
}
QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    (void)path; (void)entry;
    return qk__tune_warn(log, log_user, QK_ERROR_UNSUPPORTED, "autotune cache: not implemented on this platform; no cache");
}
#endif
/* -- policy: cache, measure, fixed table -- */
static void qk__tune_pick(char *config, size_t config_size, char *label, size_t label_size,
                          const char *source, const char *chosen) {
    snprintf(config, config_size, "%s", chosen);
    if (label && label_size) snprintf(label, label_size, "%s: %s", source, chosen);
}

QKDEF qk_result qk_tune_choose(const qk_tune_request *req, char *config, size_t config_size,
                               char *label, size_t label_size) {
    char path[QK__TUNE_PATH_MAX];
    qk_tune_entry e;
    qk_result r;
    int have_path;
    if (!req || !config || config_size == 0 || !req->fixed_config)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "autotune: req, config or fixed_config is NULL");
    memset(&e, 0, sizeof e);
    if ((r = qk__tune_key_norm(&req->key, &e.key)) != QK_OK) return r;
    if (req->mode < 0) {
        qk__tune_pick(config, config_size, label, label_size, "fixed (autotune off)", req->fixed_config);
        return QK_OK;
    }
    if (!req->measure) {
        qk__tune_pick(config, config_size, label, label_size, "fixed (no tuner)", req->fixed_config);
        return QK_OK;
    }
    have_path = qk_tune_cache_path(req->cache_dir, path, sizeof path) == QK_OK;
    if (!have_path)
        qk__tune_warn(req->log, req->log_user, QK_ERROR_IO, "%s; tuning without a cache", qk_last_error());
    if (have_path && req->mode == 0 &&
        qk_tune_cache_lookup(path, &e.key, &e, req->log, req->log_user) == QK_OK) {
        qk__tune_pick(config, config_size, label, label_size, "tuned (cache)", e.config);
        return QK_OK;
    }
    memset(e.config, 0, sizeof e.config);
    e.metric = 0;
    r = req->measure(&e.key, e.config, sizeof e.config, &e.metric, req->measure_user);
    if (r != QK_OK || !memchr(e.config, 0, sizeof e.config) || !e.config[0] || !(e.metric - e.metric == 0.0)) {
        if (r == QK_OK) qk__fail(QK_ERROR_INVALID_ARGUMENT, "the tuner returned an empty configuration or a non-finite metric");
        qk__tune_warn(req->log, req->log_user, QK_ERROR_IO, "autotune failed (%s); using the fixed table: %s",
                      qk_last_error(), req->fixed_config);
        qk__tune_pick(config, config_size, label, label_size, "fixed (autotune failed)", req->fixed_config);
        return QK_OK;
    }
    e.timestamp = 0;
    if (have_path) (void)qk_tune_cache_store(path, &e, req->log, req->log_user);  /* warns itself */
    qk__tune_pick(config, config_size, label, label_size, "tuned (measured)", e.config);
    return QK_OK;
}
#else /* !QK__TUNE_ON: a CPU-only build, nothing to tune, or QK_NO_TUNE */
#ifdef QK_NO_TUNE
#define QK__TUNE_OFF_MSG "autotune cache: compiled out (QK_NO_TUNE; the GPU engine takes the fixed table)"
#else
#define QK__TUNE_OFF_MSG "autotune cache: not compiled in (a CPU-only build: define QK_CUDA=1 or QK_TUNE_CACHE)"
#endif
QKDEF qk_result qk_tune_cache_path(const char *dir_override, char *buf, size_t size) {
    (void)dir_override;
    if (buf && size) buf[0] = 0;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_cache_lookup(const char *path, const qk_tune_key *key, qk_tune_entry *out,
                                     qk_log_fn log, void *log_user) {
    (void)path; (void)key; (void)out; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_cache_store(const char *path, const qk_tune_entry *entry, qk_log_fn log,
                                    void *log_user) {
    (void)path; (void)entry; (void)log; (void)log_user;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
QKDEF qk_result qk_tune_choose(const qk_tune_request *req, char *config, size_t config_size,
                               char *label, size_t label_size) {
    (void)req; (void)config; (void)config_size; (void)label; (void)label_size;
    return qk__fail(QK_ERROR_UNSUPPORTED, QK__TUNE_OFF_MSG);
}
#endif /* QK__TUNE_ON */
/* ---- end autotune cache ---- */

