#include "qk_internal.h"
/* >>npy_impl ---- .npy / .csv readers and writers ---- */
/* .npy (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte, the header
   length (little-endian uint16 in 1.0, uint32 in 2.0 and 3.0), the header (a Python dict literal,
   ASCII; UTF-8 in 3.0, padded with spaces and ended by '\n'), then the raw array. Only the
   stdio and POSIX (or Win32) calls below are used: fdopen/fileno would need _POSIX_C_SOURCE under
   strict -std=c11, open/write/fsync from <unistd.h> do not. */
/* the stdio and POSIX (or Win32) headers: in qk_internal.h */

/* Headers longer than this are not numpy's (it writes ~128 bytes); refusing them keeps a corrupt
   length field from turning into a huge allocation. */
#define QK__NPY_MAX_HEADER (1u << 20)

static int qk__host_little(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

typedef struct qk__npy_header {
    char descr[32];
    int fortran;
    int ndim;
    int64_t shape[4];   /* first 4 dims; ndim counts them all */
    int have_descr, have_fortran, have_shape;
} qk__npy_header;

static const char *qk__npy_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* A Python string literal in single or double quotes (no escapes: numpy never writes any). */
static const char *qk__npy_str(const char *p, const char *e, char *buf, size_t size) {
    char q;
    size_t n = 0;
    if (p >= e || (*p != '\'' && *p != '"')) return NULL;
    q = *p++;
    while (p < e && *p != q) {
        if (n + 1 < size) buf[n++] = *p;
        p++;
    }
    if (p >= e) return NULL;
    buf[n] = 0;
    return p + 1;
}

static qk_result qk__npy_parse_header(const char *path, const char *h, size_t len, qk__npy_header *o) {
    const char *p = h, *e = h + len;
    memset(o, 0, sizeof(*o));
    char ex[200];
    p = qk__npy_ws(p, e);
    if (p >= e || *p != '{')
        return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no '{'): \"%s\"", path, qk__esc(ex, sizeof ex, h, len, 60));
    p++;
    for (;;) {
        char key[32];
        p = qk__npy_ws(p, e);
        if (p < e && *p == '}') break;
        p = qk__npy_str(p, e, key, sizeof(key));
        if (!p) return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (expected a quoted key): \"%s\"", path, qk__esc(ex, sizeof ex, h, len, 80));
        p = qk__npy_ws(p, e);
        if (p >= e || *p != ':')
            return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (no ':' after '%s')", path, qk__esc(ex, sizeof ex, key, strlen(key), 40));
        p = qk__npy_ws(p + 1, e);
        if (strcmp(key, "descr") == 0) {
            if (p < e && *p == '[')
                return qk__fail(QK_ERROR_FORMAT, "%s: structured dtypes are not supported (qk reads plain float/int arrays)", path);
            p = qk__npy_str(p, e, o->descr, sizeof(o->descr));
            if (!p) return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('descr' is not a string)", path);
            o->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (e - p >= 4 && memcmp(p, "True", 4) == 0) { o->fortran = 1; p += 4; }
            else if (e - p >= 5 && memcmp(p, "False", 5) == 0) { o->fortran = 0; p += 5; }
            else return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('fortran_order' is not True or False)", path);
            o->have_fortran = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (p >= e || *p != '(')
                return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header ('shape' is not a tuple)", path);
            p++;
            for (;;) {
                int64_t v = 0;
                p = qk__npy_ws(p, e);
                if (p < e && *p == ')') { p++; break; }
                if (p >= e || *p < '0' || *p > '9')
                    return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (bad 'shape' entry)", path);
                while (p < e && *p >= '0' && *p <= '9') {
                    if (v > (INT64_MAX - 9) / 10)
                        return qk__fail(QK_ERROR_FORMAT, "%s: .npy shape entry overflows 64 bits", path);
                    v = v * 10 + (*p++ - '0');
                }
                if (p < e && *p == 'L') p++;   /* Python 2 long literal */
                if (o->ndim < 4) o->shape[o->ndim] = v;
                o->ndim++;
                p = qk__npy_ws(p, e);
                if (p < e && *p == ',') p++;
                else if (p >= e || *p != ')')
                    return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (bad 'shape' tuple)", path);
            }
            o->have_shape = 1;
        } else {
            return qk__fail(QK_ERROR_FORMAT, "%s: unexpected key '%s' in .npy header", path, qk__esc(ex, sizeof ex, key, strlen(key), 40));
        }
        p = qk__npy_ws(p, e);
        if (p < e && *p == ',') { p++; continue; }
        if (p < e && *p == '}') break;
        return qk__fail(QK_ERROR_FORMAT, "%s: malformed .npy header (expected ',' or '}')", path);
    }
    if (!o->have_descr || !o->have_fortran || !o->have_shape)
        return qk__fail(QK_ERROR_FORMAT, "%s: .npy header lacks '%s'", path,
                        !o->have_descr ? "descr" : !o->have_fortran ? "fortran_order" : "shape");
    return QK_OK;
}

/* One item of the file's dtype at p as a double: kind 'f' (IEEE binary16/32/64), 'i' (signed),
   'u' (unsigned), 'b' (bool, 0 or 1); size in bytes; swap: the file's byte order is not the
   host's. 64-bit integers beyond 2^53 round to the nearest double, as numpy's astype does. */
static double qk__npy_item(const unsigned char *p, char kind, int size, int swap) {
    unsigned char t[8];
    uint64_t u = 0;
    int k;
    for (k = 0; k < size && k < (int)sizeof t; k++) t[k] = p[swap ? size - 1 - k : k];
    if (kind == 'b') return t[0] != 0 ? 1.0 : 0.0;
    if (kind == 'f' && size == 8) { double d; memcpy(&d, t, 8); return d; }
    if (kind == 'f' && size == 4) { float f; memcpy(&f, t, 4); return (double)f; }
    if (kind == 'f') {   /* binary16: sign, 5 exponent bits (bias 15), 10 fraction bits */
        uint16_t h;
        int ex, fr;
        double v;
        memcpy(&h, t, 2);
        ex = (h >> 10) & 0x1f;
        fr = h & 0x3ff;
        if (ex == 0) v = ldexp((double)fr, -24);
        else if (ex == 31) v = fr ? (double)NAN : (double)INFINITY;
        else v = ldexp((double)(fr | 0x400), ex - 25);
        return (h & 0x8000) ? -v : v;
    }
    /* integers: the host-order bytes in t, widened by value */
    if (size == 1) u = t[0];
    else if (size == 2) { uint16_t v; memcpy(&v, t, 2); u = v; }
    else if (size == 4) { uint32_t v; memcpy(&v, t, 4); u = v; }
    else memcpy(&u, t, 8);
    if (kind == 'u') return (double)u;
    if (size == 1) return (double)(int8_t)(uint8_t)u;
    if (size == 2) return (double)(int16_t)(uint16_t)u;
    if (size == 4) return (double)(int32_t)(uint32_t)u;
    return (double)(int64_t)u;
}

/* Converts n items of the file's dtype, already in buf, to doubles in place, from the last to
   the first: item i (at size * i <= 8 * i) is read before the doubles of items >= i are
   written, so no item is overwritten before it is read. */
static void qk__npy_to_double(unsigned char *buf, int64_t n, char kind, int size, int swap) {
    int64_t i;
    for (i = n; i-- > 0;) {
        double d = qk__npy_item(buf + (size_t)size * (size_t)i, kind, size, swap);
        memcpy(buf + 8 * (size_t)i, &d, 8);
    }
}

/* ---- reading files: regular files only ---- */
/* The readers open a path only when it names a regular file: a FIFO would block in open() until
   a writer comes (forever), a device such as /dev/zero never ends, a directory is no data. The
   path is stat()ed first, so that a device is never even opened, then opened without blocking
   and fstat()ed again (the check that counts, free of races). The size from fstat bounds every
   allocation: nothing is allocated for data the file does not hold. */
#ifdef _WIN32
typedef struct _stati64 qk__stat_t;
#define QK__STAT(p, st) _stati64((p), (st))
#define QK__FSTAT(fd, st) _fstati64((fd), (st))
#define QK__OPEN_RD(p) _open((p), _O_RDONLY | _O_BINARY)
#define QK__READ(fd, b, n) _read((fd), (b), (unsigned)(n))
#define QK__RCLOSE(fd) _close(fd)
#define QK__S_ISREG(m) (((m) & _S_IFMT) == _S_IFREG)
#define QK__S_ISDIR(m) (((m) & _S_IFMT) == _S_IFDIR)
#define QK__S_ISFIFO(m) 0
#define QK__S_ISCHR(m) (((m) & _S_IFMT) == _S_IFCHR)
#else
typedef struct stat qk__stat_t;
#define QK__STAT(p, st) stat((p), (st))
#define QK__FSTAT(fd, st) fstat((fd), (st))
#define QK__OPEN_RD(p) open((p), O_RDONLY | O_NONBLOCK | O_NOCTTY)
#define QK__READ(fd, b, n) read((fd), (b), (n))
#define QK__RCLOSE(fd) close(fd)
#define QK__S_ISREG(m) S_ISREG(m)
#define QK__S_ISDIR(m) S_ISDIR(m)
#define QK__S_ISFIFO(m) S_ISFIFO(m)
#define QK__S_ISCHR(m) S_ISCHR(m)
#endif

static qk_result qk__not_regular(const char *path, unsigned mode) {
    const char *what = QK__S_ISDIR(mode) ? "a directory" : QK__S_ISFIFO(mode) ? "a FIFO (named pipe)"
                     : QK__S_ISCHR(mode) ? "a character device" : "not a regular file";
    char ep[QK__ESC_ARG_SIZE];
    return qk__fail(QK_ERROR_IO, "cannot read '%s': it is %s; qk reads regular files only (save the data to a file)",
                    qk__esc_arg(ep, sizeof ep, path), what);
}

/* Opens path for reading when it is a regular file: *fd_out, *size_out (bytes). */
static qk_result qk__open_regular(const char *path, int *fd_out, int64_t *size_out) {
    qk__stat_t st;
    int fd, e;
    char ep[QK__ESC_ARG_SIZE];   /* the path as the message quotes it: escaped, cut */
    if (QK__STAT(path, &st) != 0) {
        e = errno;
        return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", qk__esc_arg(ep, sizeof ep, path), strerror(e));
    }
    if (!QK__S_ISREG(st.st_mode)) return qk__not_regular(path, (unsigned)st.st_mode);
    fd = QK__OPEN_RD(path);
    if (fd < 0) {
        e = errno;
        return qk__fail(QK_ERROR_IO, "cannot open '%s': %s", qk__esc_arg(ep, sizeof ep, path), strerror(e));
    }
    if (QK__FSTAT(fd, &st) != 0) {
        int e = errno;
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_IO, "cannot read '%s': fstat: %s", path, strerror(e));
    }
    if (!QK__S_ISREG(st.st_mode)) { QK__RCLOSE(fd); return qk__not_regular(path, (unsigned)st.st_mode); }
    *fd_out = fd;
    *size_out = (int64_t)st.st_size;
    return QK_OK;
}

/* Reads up to n bytes (fewer only at the end of the file); retries EINTR and short reads.
   Returns the count, or -1 with errno set. */
static int64_t qk__read_full(int fd, void *buf, size_t n) {
    unsigned char *p = (unsigned char *)buf;
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30);
        long k = (long)QK__READ(fd, p + got, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    return (int64_t)got;
}

static const char *qk__shape_str(char *buf, size_t size, const qk__npy_header *h) {
    if (h->ndim == 1) snprintf(buf, size, "(%lld,)", (long long)h->shape[0]);
    else if (h->ndim == 2) snprintf(buf, size, "(%lld, %lld)", (long long)h->shape[0], (long long)h->shape[1]);
    else snprintf(buf, size, "(%d dimensions)", h->ndim);
    return buf;
}

/* Opens path and reads its preamble and header (every .npy reader's first step): *fd_out is left
   at the first data byte, *avail_out holds the bytes after the header, h the parsed header. On
   error nothing is left open. */
static qk_result qk__npy_open(const char *path, int *fd_out, int64_t *avail_out, qk__npy_header *h, int64_t *off_out) {
    unsigned char pre[12];
    char *hdr = NULL;
    int fd = -1;
    size_t hlen, plen;
    int64_t got, fsize = 0;
    qk_result r;
    int major, minor;

    r = qk__open_regular(path, &fd, &fsize);
    if (r != QK_OK) return r;
    got = qk__read_full(fd, pre, 10);
    if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    if (got < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", path);
        goto fail;
    }
    if (got < 10) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
    major = pre[6];
    minor = pre[7];
    plen = 10;
    if (major == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (major == 2 || major == 3) {
        if (qk__read_full(fd, pre + 10, 2) != 2) { r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy preamble", path); goto fail; }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
        plen = 12;
    } else {
        r = qk__fail(QK_ERROR_FORMAT, "%s: .npy version %d.%d is not supported (qk reads 1.0, 2.0, 3.0)", path, major, minor);
        goto fail;
    }
    if (hlen == 0 || hlen > QK__NPY_MAX_HEADER) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: implausible .npy header length %lu", path, (unsigned long)hlen);
        goto fail;
    }
    if (fsize < (int64_t)(plen + hlen)) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy header (%lld of %lu bytes)", path,
                     (long long)(fsize > (int64_t)plen ? fsize - (int64_t)plen : 0), (unsigned long)hlen);
        goto fail;
    }
    hdr = (char *)QK_MALLOC(hlen + 1);
    if (!hdr) { r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for the .npy header", path); goto fail; }
    got = qk__read_full(fd, hdr, hlen);
    if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    if ((size_t)got < hlen) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated .npy header (%lu of %lu bytes)", path, (unsigned long)got, (unsigned long)hlen);
        goto fail;
    }
    hdr[hlen] = 0;
    r = qk__npy_parse_header(path, hdr, hlen, h);
    if (r != QK_OK) goto fail;
    QK_FREE(hdr);
    *fd_out = fd;
    *avail_out = fsize - (int64_t)(plen + hlen);
    if (off_out) *off_out = (int64_t)(plen + hlen);
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (hdr) QK_FREE(hdr);
    return r;
}

/* The data of a .npy read whole: no byte may follow (the file grew while it was read, or holds
   more than its shape). shp, dsc: the header's shape and descr, for the message. */
static qk_result qk__npy_check_end(int fd, const char *path, const char *shp, const char *dsc) {
    unsigned char extra;
    if (qk__read_full(fd, &extra, 1) != 0)
        return qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs", path, shp, dsc);
    return QK_OK;
}

QKDEF qk_result qk_npy_read(const char *path, qk_array *out) {
    unsigned char *data = NULL;
    char shp[64], dsc[48];
    int fd = -1;
    size_t nbytes;
    int64_t got, avail;
    qk__npy_header h;
    qk_result r;
    int size, swap;
    size_t dlen;
    char order, kind;
    int64_t rows, cols, count;

    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_read: path and out must not be NULL");
    r = qk__npy_open(path, &fd, &avail, &h, NULL);
    if (r != QK_OK) return r;

    qk__esc(dsc, sizeof dsc, h.descr, strlen(h.descr), 31);
    order = h.descr[0];
    kind = h.descr[1];
    dlen = strlen(h.descr);
    size = dlen == 3 && h.descr[2] >= '1' && h.descr[2] <= '9' ? h.descr[2] - '0' : 0;
    if (strchr(h.descr, 'O')) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: object arrays (dtype '%s', pickled Python objects) are not supported", path, dsc);
        goto fail;
    }
    if (dlen == 4 && kind == 'f' && (strcmp(h.descr + 2, "16") == 0 || strcmp(h.descr + 2, "12") == 0 || strcmp(h.descr + 2, "10") == 0)) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is long double, whose layout depends on the machine that wrote it "
                     "(x87 80-bit or IEEE 128-bit); save a.astype(np.float64)", path, dsc);
        goto fail;
    }
    /* What numpy writes for a real array: float16/32/64, signed and unsigned integers of 1 to 8
       bytes, bool; any byte order ('|' is numpy's "not applicable", for 1-byte items). */
    if (!strchr("<>=|", order) || order == 0 || size == 0 ||
        !((kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
          ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
          (kind == 'b' && size == 1))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is not supported (qk reads float16/32/64 (f2 f4 f8), "
                     "integers (i1 i2 i4 i8 u1 u2 u4 u8) and bool (b1), either byte order)", path, dsc);
        goto fail;
    }
    if (h.ndim < 1 || h.ndim > 2) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the array has %d dimensions; qk reads 1-D or 2-D arrays", path, h.ndim);
        goto fail;
    }
    qk__shape_str(shp, sizeof shp, &h);
    rows = h.shape[0];
    cols = h.ndim == 2 ? h.shape[1] : 1;
    if (cols > 0 && rows > INT64_MAX / 8 / cols) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s is too large", path, shp);
        goto fail;
    }
    count = rows * cols;
    nbytes = (size_t)((uint64_t)count * (uint64_t)size);
    /* The file size must match the header before anything is allocated for the data: a
       200-byte file that claims 48 GB is refused here, not by malloc (or worse, under
       overcommit, after a 48 GB allocation). */
    if ((uint64_t)avail < (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %llu bytes for shape %s of %s", path,
                     (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size), shp, dsc);
        goto fail;
    }
    if ((uint64_t)avail > (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs (%lld bytes, not %llu)", path,
                     shp, dsc, (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size));
        goto fail;
    }
    if ((uint64_t)count > (uint64_t)(SIZE_MAX / 8)) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", path, (long long)count);
        goto fail;
    }
    /* One element at least, so that an empty array still has a non-NULL data pointer. */
    data = (unsigned char *)QK_MALLOC((size_t)(count > 0 ? count : 1) * 8);
    if (!data) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld elements", path, (long long)count);
        goto fail;
    }
    swap = order == '=' || order == '|' ? 0 : ((order == '<') != qk__host_little());
    if (h.fortran && rows > 1 && cols > 1) {
        /* Fortran order (what np.save writes for an F-contiguous array, e.g. pandas'
           df.to_numpy()): column after column. Read in chunks and transposed into the row-major
           array as they come: the only memory besides the array is one 16 KiB chunk. */
        unsigned char chunk[16384];
        size_t per = sizeof chunk / (size_t)size, done = 0, k;
        got = 0;
        while (done < (size_t)count) {
            size_t want = (size_t)count - done < per ? (size_t)count - done : per;
            int64_t g = qk__read_full(fd, chunk, want * (size_t)size);
            if (g < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
            got += g;
            if ((size_t)g < want * (size_t)size) break;
            for (k = 0; k < want; k++) {
                size_t idx = done + k;   /* column idx / rows, row idx % rows */
                double d = qk__npy_item(chunk + k * (size_t)size, kind, size, swap);
                memcpy(data + 8 * ((idx % (size_t)rows) * (size_t)cols + idx / (size_t)rows), &d, 8);
            }
            done += want;
        }
    } else {
        got = qk__read_full(fd, data, nbytes);
        if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    }
    if ((size_t)got < nbytes) {   /* the file shrank while it was read */
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %lu bytes for shape %s of %s", path,
                     (long long)got, (unsigned long)nbytes, shp, dsc);
        goto fail;
    }
    if ((r = qk__npy_check_end(fd, path, shp, dsc)) != QK_OK) goto fail;
    QK__RCLOSE(fd);
    /* C order; or Fortran order with one row or one column, the same bytes */
    if (!(h.fortran && rows > 1 && cols > 1)) qk__npy_to_double(data, count, kind, size, swap);
    out->data = (double *)(void *)data;
    out->rows = rows;
    out->cols = cols;
    out->ndim = h.ndim;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (data) QK_FREE(data);
    return r;
}

/* ---- states from .npy (qk_npy_read_states) ---- */
/* One item of the file's dtype at p into dst as an element of type `to` (qk_npy_read_states):
   complex items component by component (each swapped on its own), float64 / float32 as they
   are, float16 widened to float32, integers and bool to float64 (as numpy's astype). */
static void qk__npy_state_item(const unsigned char *p, char kind, int size, int swap, qk_state_type to, unsigned char *dst) {
    int k, c, half;
    if (kind == 'c' || (kind == 'f' && size >= 4)) {
        half = kind == 'c' ? size / 2 : size;
        for (c = 0; c < size / half; c++)
            for (k = 0; k < half; k++) dst[c * half + k] = p[c * half + (swap ? half - 1 - k : k)];
    } else if (to == QK_STATE_F32) {
        float f = (float)qk__npy_item(p, kind, size, swap);   /* float16: exact in float32 */
        memcpy(dst, &f, 4);
    } else {
        double d = qk__npy_item(p, kind, size, swap);
        memcpy(dst, &d, 8);
    }
}

/* A .npy of states opened and its header checked (qk__npy_states_open): what qk_npy_read_states
   reads, and what a reader of single rows needs (qk-gram-mpi's state provider reads the rows a
   rank asks for at data_off + row * row_items * size). */
typedef struct qk__npy_states {
    qk_state_type type;     /* the type the items are read as */
    int64_t n, dim;         /* n states of dim amplitudes (mixed: n dim x dim matrices) */
    int64_t count;          /* items in the file: n dim, or n dim^2 */
    int64_t row_items;      /* items of one state: dim, or dim^2 */
    int64_t data_off;       /* the first data byte */
    int mixed;              /* 3-D: density matrices */
    int size, swap;         /* an item's bytes in the file; its byte order is not the host's */
    int transposed;         /* Fortran order with more than one axis longer than 1: no row is contiguous */
    int direct;             /* the file's bytes are the elements (no conversion, not transposed) */
    char kind;              /* 'c', 'f', 'i', 'u', 'b' */
    char dsc[48], shp[96];  /* the dtype and shape as messages quote them */
} qk__npy_states;

/* Opens path and checks its header for states (dtype, shape, and a file size that matches the
   shape exactly), as qk_npy_read_states does; *fd_out is left at the first data byte. On error
   nothing is left open. */
static qk_result qk__npy_states_open(const char *path, int *fd_out, qk__npy_states *f) {
    int fd = -1, size = 0, i, longer;
    int64_t avail, n, dim, count;
    qk__npy_header h;
    qk_result r;
    char order, kind;
    const char *digits;

    memset(f, 0, sizeof *f);
    r = qk__npy_open(path, &fd, &avail, &h, &f->data_off);
    if (r != QK_OK) return r;
    qk__esc(f->dsc, sizeof f->dsc, h.descr, strlen(h.descr), 31);
    order = h.descr[0];
    kind = h.descr[1];
    for (digits = h.descr + 2; *digits >= '0' && *digits <= '9' && size < 100; digits++) size = size * 10 + (*digits - '0');
    if (strchr(h.descr, 'O')) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: object arrays (dtype '%s', pickled Python objects) are not supported", path, f->dsc);
        goto fail;
    }
    if ((kind == 'c' && size == 32) || (kind == 'f' && (size == 16 || size == 12 || size == 10)) || (kind == 'c' && (size == 24 || size == 20))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is long double, whose layout depends on the machine that wrote it; "
                     "save S.astype(np.complex128)", path, f->dsc);
        goto fail;
    }
    /* complex128 / complex64 / float64 / float32 kept as they are; float16 read as float32,
       integers and bool as float64; either byte order */
    if (!order || !strchr("<>=|", order) || h.descr[1] == 0 || *digits != 0 ||
        !((kind == 'c' && (size == 16 || size == 8)) || (kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
          ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) || (kind == 'b' && size == 1))) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: dtype '%s' is not supported for states (qk reads complex128, complex64, float64 and "
                     "float32 (c16 c8 f8 f4), and float16, integers and bool as real amplitudes, either byte order)", path, f->dsc);
        goto fail;
    }
    f->type = kind == 'c' ? (size == 16 ? QK_STATE_C128 : QK_STATE_C64) : kind == 'f' && size <= 4 ? QK_STATE_F32 : QK_STATE_F64;
    if (h.ndim == 2) snprintf(f->shp, sizeof f->shp, "(%lld, %lld)", (long long)h.shape[0], (long long)h.shape[1]);
    else if (h.ndim == 3) snprintf(f->shp, sizeof f->shp, "(%lld, %lld, %lld)", (long long)h.shape[0], (long long)h.shape[1], (long long)h.shape[2]);
    else if (h.ndim == 1) snprintf(f->shp, sizeof f->shp, "(%lld,)", (long long)h.shape[0]);
    else snprintf(f->shp, sizeof f->shp, "(%d dimensions)", h.ndim);
    if (h.ndim != 2 && h.ndim != 3) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s: states are 2-D (n_states, dim) or, density matrices, 3-D (n, dim, dim)%s",
                     path, f->shp, h.ndim == 1 ? " (for one state, save s.reshape(1, -1))" : "");
        goto fail;
    }
    n = h.shape[0];
    dim = h.shape[1];
    if (h.ndim == 3 && h.shape[2] != dim) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s: density matrices must be square (n, dim, dim)", path, f->shp);
        goto fail;
    }
    /* n * dim (* dim) items, and their bytes as read and as stored, without overflow */
    count = 0;
    if (dim > 0 && n > 0) {
        if ((h.ndim == 3 && (dim > INT64_MAX / 16 / dim || n > INT64_MAX / 16 / (dim * dim))) || (h.ndim == 2 && n > INT64_MAX / 16 / dim)) {
            r = qk__fail(QK_ERROR_FORMAT, "%s: shape %s is too large", path, f->shp);
            goto fail;
        }
        count = h.ndim == 3 ? n * dim * dim : n * dim;
    }
    /* The file size must match the header before anything is allocated (a 200-byte file that
       claims 48 GB is "truncated", not an allocation). */
    if ((uint64_t)avail < (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: %lld of %llu bytes for shape %s of %s", path, (long long)avail,
                     (unsigned long long)((uint64_t)count * (uint64_t)size), f->shp, f->dsc);
        goto fail;
    }
    if ((uint64_t)avail > (uint64_t)count * (uint64_t)size) {
        r = qk__fail(QK_ERROR_FORMAT, "%s: the file holds more data than shape %s of %s needs (%lld bytes, not %llu)", path,
                     f->shp, f->dsc, (long long)avail, (unsigned long long)((uint64_t)count * (uint64_t)size));
        goto fail;
    }
    f->n = n;
    f->dim = dim;
    f->count = count;
    f->row_items = h.ndim == 3 ? dim * dim : dim;
    f->mixed = h.ndim == 3;
    f->size = size;
    f->kind = kind;
    f->swap = order == '=' || order == '|' ? 0 : ((order == '<') != qk__host_little());
    /* Fortran order is a transpose unless at most one axis is longer than 1 */
    for (i = 0, longer = 0; i < h.ndim; i++) longer += h.shape[i] > 1;
    f->transposed = h.fortran && longer > 1;
    f->direct = !f->transposed && !f->swap && size == qk__state_esize(f->type) && (kind == 'c' || kind == 'f');
    *fd_out = fd;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    return r;
}

QKDEF qk_result qk_npy_read_states(const char *path, qk_states_array *out) {
    unsigned char *data = NULL;
    int fd = -1, esize;
    int64_t got = 0, nbytes;
    qk__npy_states f;
    qk_result r;

    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_read_states: path and out must not be NULL");
    r = qk__npy_states_open(path, &fd, &f);
    if (r != QK_OK) return r;
    esize = qk__state_esize(f.type);
    nbytes = f.count * esize;
    if ((uint64_t)nbytes >= (uint64_t)SIZE_MAX) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", path, (long long)f.count);
        goto fail;
    }
    data = (unsigned char *)QK_MALLOC((size_t)(nbytes > 0 ? nbytes : 8));
    if (!data) {
        r = qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld elements of %s (%.3g GB)", path, (long long)f.count,
                     f.dsc, (double)nbytes * 1e-9);
        goto fail;
    }
    if (f.direct) {   /* the file's bytes are the elements */
        got = qk__read_full(fd, data, (size_t)nbytes);
        if (got < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
    } else {
        /* in 16 KiB chunks, each item converted (byte order, type) to its row-major place */
        unsigned char chunk[16384];
        const int size = f.size;
        const int64_t per = (int64_t)(sizeof chunk / (size_t)size);
        const int64_t s0 = f.n, s1 = f.dim, s2 = f.mixed ? f.dim : 1;
        int64_t done = 0, k;
        while (done < f.count) {
            const int64_t want = f.count - done < per ? f.count - done : per;
            const int64_t g = qk__read_full(fd, chunk, (size_t)(want * size));
            if (g < 0) { r = qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(errno)); goto fail; }
            got += g / size * esize;
            if (g < want * size) break;
            for (k = 0; k < want; k++) {
                int64_t idx = done + k, c;
                if (f.transposed) {   /* idx = i0 + s0 (i1 + s1 i2) */
                    const int64_t i0 = idx % s0, rest = idx / s0;
                    c = (i0 * s1 + rest % s1) * s2 + rest / s1;
                } else c = idx;
                qk__npy_state_item(chunk + k * size, f.kind, size, f.swap, f.type, data + (size_t)c * (size_t)esize);
            }
            done += want;
        }
    }
    if (got < nbytes) {   /* the file shrank while it was read */
        r = qk__fail(QK_ERROR_FORMAT, "%s: truncated data: the file shrank while it was read (shape %s of %s)", path, f.shp, f.dsc);
        goto fail;
    }
    if ((r = qk__npy_check_end(fd, path, f.shp, f.dsc)) != QK_OK) goto fail;
    QK__RCLOSE(fd);
    out->data = data;
    out->type = f.type;
    out->n = f.n;
    out->dim = f.dim;
    out->mixed = f.mixed;
    return QK_OK;
fail:
    QK__RCLOSE(fd);
    if (data) QK_FREE(data);
    return r;
}

QKDEF void qk_states_array_free(qk_states_array *a) {
    if (!a) return;
    if (a->data) QK_FREE(a->data);
    memset(a, 0, sizeof *a);
}

/* QK__OPEN_TMP, QK__WRITE, QK__FSYNC, QK__CLOSE, QK__GETPID, QK__RENAME: in qk_internal.h */

/* Writes all n bytes; retries short writes and EINTR. */
QK__PRIV int qk__write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        long w = (long)QK__WRITE(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) { errno = EIO; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Temporary names: path.tmp.<pid>.<k>.<host>, host this machine's node name (uname) with every
   character other than a letter, digit or '-' made '_', at most 40 of them ("" where unknown).
   The pid and the host let a later run tell a dead process's temporary from a live one's. */
#define QK__HOST_TAG 41
static void qk__host_tag(char *tag)
{
#ifndef _WIN32
    struct utsname u;
    size_t i;
    tag[0] = 0;
    if (uname(&u) != 0) return;
    for (i = 0; i + 1 < QK__HOST_TAG && u.nodename[i]; i++) {
        char c = u.nodename[i];
        tag[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    tag[i] = 0;
#else
    tag[0] = 0;
#endif
}

/* Removes the temporaries of path that dead processes of this host left (a killed qk-gram, a
   SIGKILLed MPI rank): names path.tmp.<pid>.<k>.<host> in path's directory with this host's tag,
   a pid other than ours that is not running, owned by this user. Best effort and Linux only (a
   process is running while /proc/<pid> exists; without /proc nothing is removed). Never a live
   process's temporary; one of another host, or of an older qk without the host in the name, is
   left alone. */
static void qk__sweep_tmp(const char *path)
{
#if defined(__linux__)
    char host[QK__HOST_TAG], dir[4096], full[4096 + 256], proc[64];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t blen = strlen(base), dl = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    struct stat st;
    struct dirent *e;
    DIR *d;
    qk__host_tag(host);
    if (!host[0] || blen == 0 || dl >= sizeof dir || stat("/proc/self", &st) != 0) return;
    if (slash) memcpy(dir, path, dl);
    else dir[0] = '.';
    dir[dl] = 0;
    d = opendir(dir);
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name, *q;
        long pid = 0;
        int digits = 0;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0) continue;
        for (q = n + blen + 5; *q >= '0' && *q <= '9' && digits < 10; q++, digits++) pid = pid * 10 + (*q - '0');
        if (digits == 0 || *q != '.' || pid <= 0 || pid == QK__GETPID()) continue;
        for (q++, digits = 0; *q >= '0' && *q <= '9'; q++) digits++;
        if (digits == 0 || *q != '.' || strcmp(q + 1, host) != 0) continue;
        snprintf(proc, sizeof proc, "/proc/%ld", pid);
        if (stat(proc, &st) == 0 || errno != ENOENT) continue;   /* running, or unknown */
        if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, n) >= sizeof full) continue;
        if (stat(full, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
        (void)unlink(full);
    }
    closedir(d);
#else
    QK__UNUSED(path);
#endif
}

/* Creates a temporary file next to path (same directory, so that rename stays within one file
   system): *tmp_out gets its name (QK_MALLOC'ed), *fd_out its descriptor. O_EXCL makes the name
   ours even when another thread or process writes the same path: a taken name is skipped, never
   shared. Stale temporaries of path (qk__sweep_tmp) are removed first. */
QK__PRIV qk_result qk__open_tmp(const char *path, char **tmp_out, int *fd_out) {
    size_t plen = strlen(path);
    char *tmp = (char *)QK_MALLOC(plen + 48 + QK__HOST_TAG);
    char host[QK__HOST_TAG];
    int fd = -1, i;
    *tmp_out = NULL;
    *fd_out = -1;
    if (!tmp) return qk__fail(QK_ERROR_OUT_OF_MEMORY, "cannot write '%s': out of memory", path);
    qk__sweep_tmp(path);
    qk__host_tag(host);
    for (i = 0; i < 1000; i++) {
        snprintf(tmp, plen + 48 + QK__HOST_TAG, "%s.tmp.%ld.%d%s%s", path, QK__GETPID(), i, host[0] ? "." : "", host);
        fd = QK__OPEN_TMP(tmp);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        qk_result r = qk__fail(QK_ERROR_IO, "cannot write '%s': creating '%s' failed: %s", path, tmp, strerror(errno));
        QK_FREE(tmp);
        return r;
    }
    *tmp_out = tmp;
    *fd_out = fd;
    return QK_OK;
}

/* After a rename: the new name is durable once the directory entry is on disk. Best effort
   (some file systems refuse fsync on a directory). */
QK__PRIV void qk__sync_dir(const char *path) {
#ifndef _WIN32
    const char *slash = strrchr(path, '/');
    char dir[4096];
    int dfd;
    if (slash) {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        if (dl >= sizeof dir) return;
        memcpy(dir, path, dl);
        dir[dl] = 0;
        dfd = open(dir, O_RDONLY);
    } else {
        dfd = open(".", O_RDONLY);
    }
    if (dfd >= 0) { (void)fsync(dfd); (void)close(dfd); }
#else
    QK__UNUSED(path);
#endif
}

/* The commit protocol's last steps, in one place for every writer of a temporary file from
   qk__open_tmp (the atomic writer below, the streamed .npy of K, qk_gram_mpi's MPI-IO file): the
   caller has written, synced (unless asked not to) and closed it; qk__tmp_commit renames it over
   path and syncs the directory (unless no_sync); on failure the temporary is removed and path is
   left as it was. qk__tmp_discard removes a temporary (after a failure or a cancel), truncating it
   first so that pages under writeback are dropped rather than waited for. */
QK__PRIV qk_result qk__tmp_commit(const char *tmp, const char *path, int no_sync) {
    if (QK__RENAME(tmp, path) != 0) {
        const int e = errno;
        (void)remove(tmp);
        return qk__fail(QK_ERROR_IO, "cannot write '%s': rename failed: %s", path, strerror(e));
    }
    if (!no_sync) qk__sync_dir(path);
    return QK_OK;
}

QK__PRIV void qk__tmp_discard(const char *tmp) {
    int t;
    if (!tmp) return;
    t = open(tmp, O_WRONLY | O_TRUNC);
    if (t >= 0) (void)QK__CLOSE(t);
    (void)remove(tmp);
}

/* Writes a then b to path atomically: a temporary file in the same directory, fsync, rename
   over path. On any error the temporary file is removed and path is left as it was. Also for
   other writers of this header (cache files). */
QK__PRIV qk_result qk__write_file_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    char *tmp;
    int fd, err;
    const char *what;
    qk_result r0;

    if (!path) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "write: path is NULL");
    r0 = qk__open_tmp(path, &tmp, &fd);
    if (r0 != QK_OK) return r0;
    what = "write";
    if (qk__write_all(fd, a, na) != 0 || (nb > 0 && qk__write_all(fd, b, nb) != 0)) goto fail;
    what = "fsync";
    if (QK__FSYNC(fd) != 0) goto fail;
    what = "close";
    err = QK__CLOSE(fd);
    fd = -1;
    if (err != 0) goto fail;
    r0 = qk__tmp_commit(tmp, path, 0);
    QK_FREE(tmp);
    return r0;
fail:
    {
        int e = errno;
        qk_result r;
        if (fd >= 0) (void)QK__CLOSE(fd);
        (void)remove(tmp);
        r = qk__fail(QK_ERROR_IO, "cannot write '%s': %s failed: %s", path, what, strerror(e));
        QK_FREE(tmp);
        return r;
    }
}

/* The .npy header of a C-order float32/float64 array (cols == 0: 1-D) into hdr; returns its
   length, a multiple of 64 (numpy pads with spaces and a final '\n' so that the data starts on
   a 64-byte boundary: memory-mapped readers rely on the alignment). */
QK__PRIV size_t qk__npy_make_header(char hdr[192], qk_dtype dtype, int64_t rows, int64_t cols) {
    int itemsize = dtype == QK_F32 ? 4 : 8, len;
    size_t total;
    /* Native byte order: the data is written as it lies in memory. */
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    if (cols > 0)
        len = snprintf(hdr + 10, 192 - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld, %lld), }",
                       qk__host_little() ? '<' : '>', itemsize, (long long)rows, (long long)cols);
    else
        len = snprintf(hdr + 10, 192 - 10, "{'descr': '%cf%d', 'fortran_order': False, 'shape': (%lld,), }",
                       qk__host_little() ? '<' : '>', itemsize, (long long)rows);
    total = ((size_t)(10 + len + 1) + 63) / 64 * 64;
    memset(hdr + 10 + len, ' ', total - (size_t)(10 + len) - 1);
    hdr[total - 1] = '\n';
    hdr[8] = (char)((total - 10) & 0xff);
    hdr[9] = (char)((total - 10) >> 8);
    return total;
}

/* Checks a 2-D (cols > 0) or 1-D (cols == 0) shape of float32/float64 and returns its bytes. */
QK__PRIV qk_result qk__npy_shape_bytes(const char *who, qk_dtype dtype, int64_t rows, int64_t cols, size_t *nbytes) {
    size_t itemsize;
    int64_t count;
    if (dtype != QK_F32 && dtype != QK_F64)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: dtype %d is neither QK_F32 nor QK_F64", who, (int)dtype);
    if (rows < 0 || cols < 0)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: negative shape (%lld, %lld)", who, (long long)rows, (long long)cols);
    itemsize = dtype == QK_F32 ? 4 : 8;
    if (cols > 0 && rows > INT64_MAX / 8 / cols)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: shape (%lld, %lld) is too large", who, (long long)rows, (long long)cols);
    count = cols > 0 ? rows * cols : rows;
    if ((uint64_t)count > (uint64_t)(SIZE_MAX / itemsize))
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "%s: %lld elements do not fit in memory", who, (long long)count);
    *nbytes = (size_t)count * itemsize;
    return QK_OK;
}

QKDEF qk_result qk_npy_write(const char *path, const void *data, qk_dtype dtype, int64_t rows,
                             int64_t cols) {
    char hdr[192];
    size_t nbytes = 0, total;
    qk_result r;

    if (!path) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: path is NULL");
    if (dtype == QK_DTYPE_DEFAULT) dtype = QK_F64;
    r = qk__npy_shape_bytes("qk_npy_write", dtype, rows, cols, &nbytes);
    if (r != QK_OK) return r;
    if (!data && nbytes > 0) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_npy_write: data is NULL");
    total = qk__npy_make_header(hdr, dtype, rows, cols);
    return qk__write_file_atomic(path, hdr, total, data, nbytes);
}

#ifndef QK_NO_CSV   /* the CSV reader (compiled out by QK_NO_CSV: qk_csv_read says so) */
/* Reads a whole regular file (at most max bytes) into a NUL-terminated buffer. */
static qk_result qk__read_file(const char *path, int64_t max, const char *macro, char **out, size_t *out_len) {
    int fd;
    int64_t size, got;
    char *buf;
    unsigned char extra;
    qk_result r = qk__open_regular(path, &fd, &size);
    if (r != QK_OK) return r;
    if (size > max) {
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_FORMAT, "%s: %lld bytes, more than %s (%lld) allows", path, (long long)size, macro, (long long)max);
    }
    if ((uint64_t)size >= (uint64_t)SIZE_MAX) { QK__RCLOSE(fd); return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: too large for memory", path); }
    buf = (char *)QK_MALLOC((size_t)size + 1);
    if (!buf) {
        QK__RCLOSE(fd);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for its %lld bytes", path, (long long)size);
    }
    got = qk__read_full(fd, buf, (size_t)size);
    if (got >= 0 && qk__read_full(fd, &extra, 1) != 0) {
        QK__RCLOSE(fd);
        QK_FREE(buf);
        return qk__fail(QK_ERROR_IO, "%s: the file grew while it was read", path);
    }
    if (got < 0) {
        int e = errno;
        QK__RCLOSE(fd);
        QK_FREE(buf);
        return qk__fail(QK_ERROR_IO, "%s: read error: %s", path, strerror(e));
    }
    QK__RCLOSE(fd);
    buf[got] = 0;
    *out = buf;
    *out_len = (size_t)got;
    return QK_OK;
}

/* ---- CSV ---- */
/* The rules (docs/cli.md "Input .csv"): comma-separated numbers in C syntax ('.' decimals,
   optional exponent, inf / nan), any locale, any length, in double quotes or not ("0.1" is
   0.1); blanks around fields; blank lines and '#' comment lines skipped; '\n' or '\r\n' line
   ends; a UTF-8 byte order mark. The first other line is a header only when it reads as names:
   every non-empty field a name (qk__csv_name: it starts with a letter or '_' and is not NA,
   nan, inf and the like), at least one; otherwise it is data like any line (so NA or a U+2212
   minus there is an error naming line and column, never a dropped row). A header must name
   every column (an empty first name is how pandas' to_csv marks its index column: refused with
   that advice, since the index would be read as a feature) and as many columns as the data has. Any other byte below 0x20 (NUL included) or 0x7f is an error
   naming its line: a CSV file is text. A data field that is not a number is an error naming
   line and column, with a hint when the line holds ';' or tabs (another separator). */

/* A field with blanks (space, tab) trimmed. */
static void qk__csv_trim(const char **s, const char **e) {
    while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

/* A field in double quotes ("0.1", "x") without them: every field is read the same quoted or not. */
static void qk__csv_unquote(const char **s, const char **e) {
    if (*e - *s >= 2 && **s == '"' && (*e)[-1] == '"') {
        (*s)++;
        (*e)--;
        qk__csv_trim(s, e);
    }
}

/* A missing-value marker (NA, N/A, null, none) or a special number word (nan, inf): never a name. */
static int qk__csv_na_like(const char *s, size_t n) {
    static const char *const w[] = {"na", "n/a", "nan", "inf", "infinity", "null", "none", "nil"};
    size_t k;
    for (k = 0; k < sizeof w / sizeof w[0]; k++)
        if (qk__ci_eq(s, n, w[k])) return 1;
    return 0;
}

/* Holds U+2212 MINUS SIGN (what word processors and some exports write for '-'). */
static int qk__csv_u2212(const char *s, const char *e) {
    for (; e - s >= 3; s++)
        if (!memcmp(s, "\xe2\x88\x92", 3)) return 1;
    return 0;
}

/* Reads as a column name (a trimmed, unquoted, non-empty field): it starts with an ASCII letter,
   '_' or a non-ASCII letter, and is not NA, nan, inf and the like. A non-ASCII character counts
   as a letter unless it is in a block of signs, punctuation, digits or symbols (U+2212 MINUS
   SIGN, the dashes, fullwidth digits and minus, x and division signs, superscripts). */
static int qk__csv_name(const char *s, const char *e) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t cp;
    if (qk__csv_na_like(s, (size_t)(e - s))) return 0;
    if ((u[0] >= 'a' && u[0] <= 'z') || (u[0] >= 'A' && u[0] <= 'Z') || u[0] == '_') return 1;   /* any locale */
    if (u[0] >= 0xC2 && u[0] <= 0xDF && e - s >= 2 && (u[1] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    else if (u[0] >= 0xE0 && u[0] <= 0xEF && e - s >= 3 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    else if (u[0] >= 0xF0 && u[0] <= 0xF4 && e - s >= 4 && (u[1] & 0xC0) == 0x80 && (u[2] & 0xC0) == 0x80 &&
             (u[3] & 0xC0) == 0x80)
        cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
             (u[3] & 0x3F);
    else
        return 0;   /* an ASCII sign, digit or punctuation, or not UTF-8 */
    if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return 0;                 /* Latin-1 signs and symbols */
    if (cp >= 0x300 && cp <= 0x36F) return 0;                            /* combining marks */
    if (cp >= 0x2000 && cp <= 0x2BFF) return 0;                          /* punctuation, dashes, minus, math */
    if (cp >= 0x3000 && cp <= 0x303F) return 0;                          /* CJK punctuation */
    if ((cp >= 0xFE50 && cp <= 0xFE6F) || (cp >= 0xFF00 && cp <= 0xFF20) || /* small and fullwidth forms */
        (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65) || cp >= 0xFFF0) return 0;
    return 1;
}

typedef struct qk__csv_scan_state {
    const char *path;
    qk__radix rx;
    double *data;           /* NULL: count only */
    int64_t rows, cols, cols_line, header_cols, header_line, k;
} qk__csv_scan_state;

/* One data line: every field a number. */
static qk_result qk__csv_line(qk__csv_scan_state *c, const char *s, const char *e, int64_t line, int first) {
    const char *f = s;
    int64_t col = 0;
    char ex[200];
    for (;;) {
        const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b, *qa, *qb;
        size_t n;
        double v;
        if (!fe) fe = e;
        b = fe;
        col++;
        qk__csv_trim(&a, &b);
        qa = a;
        qb = b;
        qk__csv_unquote(&a, &b);   /* "0.1" is 0.1 */
        if (a == b)
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: empty field", c->path, (long long)line, (long long)col);
        n = qk__num_len(a, (size_t)(b - a), 1);
        if (n != (size_t)(b - a)) {
            const char *hint = "";
            if (qk__csv_na_like(a, (size_t)(b - a)))
                hint = " (a missing value: qk needs every value of every sample)";
            else if (qk__csv_u2212(a, b))
                hint = " (\\xe2\\x88\\x92 is U+2212 MINUS SIGN: write the ASCII '-')";
            else if (memchr(s, ';', (size_t)(e - s)))
                hint = " (the line holds ';': qk reads comma-separated values with '.' as the decimal point; "
                       "semicolon-separated files are not supported)";
            else if (memchr(a, '\t', (size_t)(b - a)))
                hint = " (the field holds a tab: qk reads comma-separated values, not tab-separated ones)";
            else if (memchr(a, ' ', (size_t)(b - a)))
                hint = " (the field holds a space: qk reads comma-separated values)";
            else if (first)
                hint = " (the first line is a header only when every field is a name: it starts with a letter or '_' "
                       "and is not NA, nan or inf)";
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: '%s' is not a number%s", c->path, (long long)line,
                            (long long)col, qk__esc(ex, sizeof ex, qa, (size_t)(qb - qa), 40), hint);
        }
        if (!qk__strtod_c(a, n, &c->rx, &v))
            return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: line %lld: out of memory reading a %lu-byte number", c->path,
                            (long long)line, (unsigned long)n);
        if (isinf(v) && !isalpha((unsigned char)a[a[0] == '+' || a[0] == '-']))
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, column %lld: '%s' is out of range for a double", c->path,
                            (long long)line, (long long)col, qk__esc(ex, sizeof ex, qa, (size_t)(qb - qa), 40));
        /* The counting pass has checked every row's length, so the fill pass fits. */
        if (c->data) c->data[c->k++] = v;
        if (fe == e) break;
        f = fe + 1;
    }
    if (c->cols < 0 && c->header_cols >= 0 && col != c->header_cols)
        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld has %lld columns, the header (line %lld) names %lld", c->path,
                        (long long)line, (long long)col, (long long)c->header_line, (long long)c->header_cols);
    if (c->cols < 0) { c->cols = col; c->cols_line = line; }
    else if (col != c->cols)
        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld has %lld columns, line %lld has %lld", c->path,
                        (long long)line, (long long)col, (long long)c->cols_line, (long long)c->cols);
    c->rows++;
    return QK_OK;
}

/* Walks the text once; counts rows and columns when data is NULL, fills data otherwise. */
static qk_result qk__csv_scan(const char *path, const char *text, size_t len, double *data,
                              int64_t *rows_out, int64_t *cols_out) {
    const char *p = text, *end = text + len;
    int64_t line = 0;
    int first = 1;
    qk__csv_scan_state c;
    qk_result r;
    memset(&c, 0, sizeof c);
    c.path = path;
    c.data = data;
    c.cols = c.header_cols = -1;
    qk__radix_init(&c.rx);
    if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) p += 3;   /* UTF-8 byte order mark */
    while (p < end) {
        const char *s = p, *e = (const char *)memchr(p, '\n', (size_t)(end - p)), *q;
        if (!e) e = end;
        p = e + 1;
        line++;
        if ((int64_t)(e - s) > (int64_t)QK_CSV_MAX_LINE)
            return qk__fail(QK_ERROR_FORMAT, "%s: line %lld is longer than QK_CSV_MAX_LINE (%lld bytes): not a CSV file of samples?",
                            path, (long long)line, (long long)QK_CSV_MAX_LINE);
        for (q = s; q < e; q++) {
            unsigned char ch = (unsigned char)*q;
            if ((ch < 0x20 && ch != '\t' && !(ch == '\r' && q == e - 1)) || ch == 0x7f)
                return qk__fail(QK_ERROR_FORMAT, "%s: line %lld, byte %lld (file offset %lld): control byte %s; a CSV file is "
                                "text (a binary file?%s)", path, (long long)line, (long long)(q - s + 1), (long long)(q - text),
                                ch == 0 ? "\\0" : ch == '\r' ? "\\r" : ch == 0x7f ? "\\x7f" : ch == 0x0c ? "\\f" : "below 0x20",
                                ch == '\r' ? " or old Mac line ends: qk reads \\n or \\r\\n" : "");
        }
        if (e > s && e[-1] == '\r') e--;
        for (q = s; q < e && (*q == ' ' || *q == '\t'); q++) {}
        if (q == e || *q == '#') continue;   /* blank or comment line */
        if (first) {
            const char *f = s;
            int numeric = 0, names = 0;
            int64_t col = 0;
            first = 0;
            /* A header only when it reads as names: every field a name (or empty: the header check
               below then says which column has none), at least one a name. Anything else (a
               number, NA, a U+2212 minus) makes it a data line, read or refused, never dropped. */
            for (;;) {
                const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b;
                if (!fe) fe = e;
                b = fe;
                qk__csv_trim(&a, &b);
                qk__csv_unquote(&a, &b);
                if (a != b) {
                    if (!qk__csv_name(a, b)) { numeric = 1; break; }
                    names++;
                }
                if (fe == e) break;
                f = fe + 1;
            }
            if (!numeric && names) {   /* the header: every column named */
                f = s;
                for (;;) {
                    const char *fe = (const char *)memchr(f, ',', (size_t)(e - f)), *a = f, *b;
                    if (!fe) fe = e;
                    b = fe;
                    col++;
                    qk__csv_trim(&a, &b);
                    qk__csv_unquote(&a, &b);
                    if (a == b)
                        return qk__fail(QK_ERROR_FORMAT, "%s: line %lld (the header), column %lld has no name%s", path,
                                        (long long)line, (long long)col,
                                        col == 1 && fe != e ? ": an unnamed first column is how pandas' to_csv writes its index "
                                        "(and R's write.csv its row names); save with to_csv(path, index=False) "
                                        "(write.csv(x, row.names = FALSE)) (the index would be read as a feature)" : "");
                    if (fe == e) break;
                    f = fe + 1;
                }
                c.header_cols = col;
                c.header_line = line;
                continue;
            }
            r = qk__csv_line(&c, s, e, line, 1);
        } else {
            r = qk__csv_line(&c, s, e, line, 0);
        }
        if (r != QK_OK) return r;
    }
    if (c.rows == 0) return qk__fail(QK_ERROR_FORMAT, "%s: no numeric rows", path);
    *rows_out = c.rows;
    *cols_out = c.cols;
    return QK_OK;
}

QKDEF qk_result qk_csv_read(const char *path, qk_array *out) {
    char *text = NULL;
    size_t len = 0;
    int64_t rows = 0, cols = 0;
    double *data;
    qk_result r;
    if (!path || !out) return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_csv_read: path and out must not be NULL");
    r = qk__read_file(path, (int64_t)QK_CSV_MAX_BYTES, "QK_CSV_MAX_BYTES", &text, &len);
    if (r != QK_OK) return r;
    r = qk__csv_scan(path, text, len, NULL, &rows, &cols);
    if (r != QK_OK) { QK_FREE(text); return r; }
    if ((uint64_t)rows > (uint64_t)(SIZE_MAX / 8) / (uint64_t)cols) {
        QK_FREE(text);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: %lld x %lld values do not fit in memory", path, (long long)rows, (long long)cols);
    }
    data = (double *)QK_MALLOC((size_t)rows * (size_t)cols * sizeof(double));
    if (!data) {
        QK_FREE(text);
        return qk__fail(QK_ERROR_OUT_OF_MEMORY, "%s: out of memory for %lld x %lld values", path, (long long)rows, (long long)cols);
    }
    r = qk__csv_scan(path, text, len, data, &rows, &cols);
    QK_FREE(text);
    if (r != QK_OK) { QK_FREE(data); return r; }
    out->data = data;
    out->rows = rows;
    out->cols = cols;
    out->ndim = 2;
    return QK_OK;
}
#else
QKDEF qk_result qk_csv_read(const char *path, qk_array *out) {
    (void)path; (void)out;
    return qk__fail(QK_ERROR_UNSUPPORTED, "qk_csv_read: the CSV reader is compiled out (QK_NO_CSV)");
}
#endif /* QK_NO_CSV */

QKDEF void qk_array_free(qk_array *a) {
    if (!a) return;
    if (a->data) QK_FREE(a->data);
    a->data = NULL;
    a->rows = a->cols = 0;
    a->ndim = 0;
}
/* ---- end npy / csv ---- */

