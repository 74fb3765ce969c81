/* .npy and .csv reader/writer tests: round trips of fresh random data through qk_npy_write and
   qk_npy_read; files in every supported dtype, byte order and header version written byte by
   byte here (independently of the writer); malformed files; writes that must fail without
   leaving a file behind. Exact comparisons (a round trip does no arithmetic). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <stddef.h>
/* Every host allocation of qk goes through t_malloc: a test can check that a reader refused a
   file before it allocated what the file's header claims. */
static size_t g_alloc_max = 0;
static void *t_malloc(size_t n) { if (n > g_alloc_max) g_alloc_max = n; return malloc(n); }
static void *t_realloc(void *p, size_t n) { if (n > g_alloc_max) g_alloc_max = n; return realloc(p, n); }
#define QK_MALLOC(sz) t_malloc(sz)
#define QK_REALLOC(p, sz) t_realloc(p, sz)
#define QK_FREE(p) free(p)
/* Small CSV bounds, so that the tests can reach them (the defaults are 16 GiB and 16 MiB). */
#define QK_CSV_MAX_BYTES 65536
#define QK_CSV_MAX_LINE 8192
#define QK_IMPLEMENTATION
#include "qk.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../qk_test.h"

static double rnd_double(void) { return ((double)(qk_test_rand64() >> 11) / 9007199254740992.0 - 0.5) * 2e3; }

static char dir[256];
static char pathbuf[512];
static const char *tpath(const char *name) {
    snprintf(pathbuf, sizeof(pathbuf), "%s/%s", dir, name);
    return pathbuf;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---- hand-written .npy files ---- */
typedef struct buf { unsigned char *p; size_t n, cap; } buf;
static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = (unsigned char *)realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
/* An .npy preamble + header of the given version around dict (padded to 64 like numpy). */
static void npy_header(buf *b, int major, const char *dict) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict), total = (pre + dl + 1 + 63) / 64 * 64;
    size_t hl = total - pre, i;
    unsigned char m[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 0, 0};
    m[6] = (unsigned char)major;
    for (i = 0; i < pre - 8; i++) m[8 + i] = (unsigned char)(hl >> (8 * i));
    put(b, m, pre);
    put(b, dict, dl);
    for (i = pre + dl; i < total - 1; i++) put(b, " ", 1);
    put(b, "\n", 1);
}
/* An integer value v as size bytes, little or big endian, from its bits (independent of host). */
static void put_uint(buf *b, uint64_t v, int size, int big) {
    unsigned char t[8];
    int i;
    for (i = 0; i < size; i++) t[big ? size - 1 - i : i] = (unsigned char)(v >> (8 * i));
    put(b, t, (size_t)size);
}
static uint64_t bits_f64(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static uint64_t bits_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Writes a file of the given dtype / version / shape with fresh random values, reads it back,
   compares with the values it meant to store. */
/* The value of a random item of the dtype descr (kind descr[1], size from descr + 2) and its
   bits, little-endian in *bits; independent of the reader's conversion. */
static double rnd_item(const char *descr, uint64_t *bits) {
    int size = atoi(descr + 2);
    char kind = descr[1];
    uint64_t r = qk_test_rand64();
    if (kind == 'f' && size == 8) { double d = rnd_double(); *bits = bits_f64(d); return d; }
    if (kind == 'f' && size == 4) { float f = (float)rnd_double(); *bits = bits_f32(f); return f; }
    if (kind == 'f') {   /* binary16 from its fields: normal, subnormal and signed zero cases */
        uint64_t sgn = r & 1, ex = (r >> 1) % 31, fr = (r >> 8) & 0x3ff;   /* ex 31 (inf/nan) not drawn */
        double v = ex == 0 ? ldexp((double)fr, -24) : ldexp(1.0 + (double)fr / 1024.0, (int)ex - 15);
        *bits = sgn << 15 | ex << 10 | fr;
        return sgn ? -v : v;
    }
    if (kind == 'b') { *bits = r & 1; return (double)(r & 1); }
    if (size == 8) {   /* within 2^53, exact in a double */
        int64_t v = (int64_t)(r >> 12) - (kind == 'i' ? ((int64_t)1 << 51) : 0);
        *bits = (uint64_t)v;
        return (double)v;
    }
    *bits = r & (((uint64_t)1 << (8 * size)) - 1);
    if (kind == 'u') return (double)*bits;
    return (double)((int64_t)(*bits << (64 - 8 * size)) >> (64 - 8 * size));   /* sign-extended */
}

static void hand_case_f(int major, const char *descr, int64_t rows, int64_t cols, int ndim, int fortran);
static void hand_case(int major, const char *descr, int64_t rows, int64_t cols, int ndim) {
    hand_case_f(major, descr, rows, cols, ndim, 0);
}
/* fortran: the file holds the array in Fortran order (column after column), as np.save writes
   an F-contiguous array; the reader must return it row-major. */
static void hand_case_f(int major, const char *descr, int64_t rows, int64_t cols, int ndim, int fortran) {
    buf b = {0};
    char dict[256];
    int64_t n = rows * cols, i;
    double *want = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int big = descr[0] == '>', size = atoi(descr + 2);
    const char *fo = fortran ? "True" : "False";
    qk_array a;
    qk_result r;
    if (ndim == 2)
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%lld, %lld), }", descr, fo,
                 (long long)rows, (long long)cols);
    else
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%lld,), }", descr, fo, (long long)rows);
    npy_header(&b, major, dict);
    /* want[] row-major; the file's items in its own order */
    for (i = 0; i < n; i++) {
        int64_t at = fortran ? (i % rows) * cols + i / rows : i;
        uint64_t bits;
        want[at] = rnd_item(descr, &bits);
        put_uint(&b, bits, size, big);
    }
    qk_test_write_file(tpath("hand.npy"), b.p, b.n);
    memset(&a, 0, sizeof a);
    r = qk_npy_read(tpath("hand.npy"), &a);
    CHECK(r == QK_OK, "v%d %s%s (%lld,%lld): %s %s", major, descr, fortran ? " F-order" : "", (long long)rows,
          (long long)cols, qk_result_string(r), qk_last_error());
    if (r == QK_OK) {
        int bad = 0;
        CHECK(a.rows == rows && a.cols == cols && a.ndim == ndim, "v%d %s: shape %lld x %lld ndim %d", major, descr,
              (long long)a.rows, (long long)a.cols, a.ndim);
        for (i = 0; i < n && a.rows * a.cols == n; i++) bad += a.data[i] != want[i];
        CHECK(bad == 0, "v%d %s%s (%lld,%lld): %d values differ", major, descr, fortran ? " F-order" : "",
              (long long)rows, (long long)cols, bad);
        qk_array_free(&a);
        CHECK(a.data == NULL, "qk_array_free clears data");
    }
    free(want);
    free(b.p);
}

/* A malformed file: the read must fail with want, name the problem (substring), and leave the
   caller's array untouched. */
static void bad_case(const char *what, const void *bytes, size_t n, qk_result want, const char *sub) {
    qk_array a;
    qk_result r;
    qk_test_write_file(tpath("bad.npy"), bytes, n);
    a.data = (double *)(uintptr_t)0x1234; a.rows = -7; a.cols = -9; a.ndim = 42;
    r = qk_npy_read(tpath("bad.npy"), &a);
    CHECK(r == want, "%s: got %s (%s), want %s", what, qk_result_string(r), qk_last_error(), qk_result_string(want));
    CHECK(strstr(qk_last_error(), sub) != NULL, "%s: detail '%s' lacks '%s'", what, qk_last_error(), sub);
    if (want != QK_OK)
        CHECK(a.data == (double *)(uintptr_t)0x1234 && a.rows == -7 && a.cols == -9 && a.ndim == 42,
              "%s: output touched on error", what);
    if (r == QK_OK) qk_array_free(&a);
}
static void bad_dict(const char *what, int major, const char *dict, size_t data_bytes, qk_result want, const char *sub) {
    buf b = {0};
    size_t i;
    npy_header(&b, major, dict);
    for (i = 0; i < data_bytes; i++) put(&b, "\0", 1);
    bad_case(what, b.p, b.n, want, sub);
    free(b.p);
}

static void test_round_trips(void) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 5}, {33, 1}, {3, 130}, {0, 4}, {13, 0}, {1, 0}};
    size_t s;
    int d;
    for (s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (d = 0; d < 2; d++) {
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            int64_t n = cols > 0 ? rows * cols : rows, i;
            qk_dtype dt = d ? QK_F32 : QK_F64;
            size_t isz = d ? 4 : 8;
            void *src = malloc((size_t)(n > 0 ? n : 1) * isz);
            qk_array a;
            qk_result r;
            FILE *f;
            unsigned char head[10];
            long fsize;
            for (i = 0; i < n; i++) {
                double v = rnd_double();
                if (d) ((float *)src)[i] = (float)v; else ((double *)src)[i] = v;
            }
            r = qk_npy_write(tpath("rt.npy"), src, dt, rows, cols);
            CHECK(r == QK_OK, "write %s (%lld,%lld): %s", d ? "f32" : "f64", (long long)rows, (long long)cols, qk_last_error());
            /* The header is numpy's: version 1.0, data on a 64-byte boundary, '\n' before it. */
            f = fopen(tpath("rt.npy"), "rb");
            CHECK(f != NULL, "written file opens");
            if (f) {
                size_t hl;
                int c = -1;
                CHECK(fread(head, 1, 10, f) == 10, "preamble");
                hl = (size_t)head[8] | ((size_t)head[9] << 8);
                CHECK(memcmp(head, "\x93NUMPY\x01\x00", 8) == 0, "magic and version 1.0");
                CHECK((10 + hl) % 64 == 0, "header total %lu not a multiple of 64", (unsigned long)(10 + hl));
                fseek(f, (long)(10 + hl - 1), SEEK_SET);
                c = fgetc(f);
                CHECK(c == '\n', "header ends with newline");
                fseek(f, 0, SEEK_END);
                fsize = ftell(f);
                CHECK(fsize == (long)(10 + hl + (size_t)n * isz), "file size %ld", fsize);
                fclose(f);
            }
            memset(&a, 0, sizeof a);
            r = qk_npy_read(tpath("rt.npy"), &a);
            CHECK(r == QK_OK, "read back: %s", qk_last_error());
            if (r == QK_OK) {
                int bad = 0;
                CHECK(a.ndim == (cols > 0 ? 2 : 1), "ndim %d", a.ndim);
                CHECK(a.rows == rows && a.cols == (cols > 0 ? cols : 1), "shape %lld x %lld", (long long)a.rows, (long long)a.cols);
                CHECK(a.data != NULL, "data non-NULL even when empty");
                for (i = 0; i < n; i++)
                    bad += a.data[i] != (d ? (double)((float *)src)[i] : ((double *)src)[i]);
                CHECK(bad == 0, "%d values differ", bad);
                qk_array_free(&a);
            }
            free(src);
        }
    }
    CHECK(qk_test_count_files(dir, ".tmp.") == 0, "no temporary files left after successful writes");
}

static void test_hand_written(void) {
    /* every dtype numpy writes for a real array, in both byte orders ('|' for 1-byte items) */
    static const char *descrs[] = {"<f8", "<f4", ">f8", ">f4", "<i4", "<i8", ">i4", ">i8", "<f2", ">f2",
                                   "|i1", "<i2", ">i2", "|u1", "<u2", ">u2", "<u4", ">u4", "<u8", ">u8", "|b1", "=f8"};
    size_t k;
    int major;
    for (major = 1; major <= 3; major++)
        for (k = 0; k < sizeof(descrs) / sizeof(descrs[0]); k++) {
            hand_case(major, descrs[k], 5, 3, 2);
            hand_case(major, descrs[k], 9, 1, 1);
            /* Fortran order: transposed on read; one row, one column, 1-D (the same bytes as C
               order) and an array larger than the reader's 16 KiB chunk with a ragged end */
            hand_case_f(major, descrs[k], 5, 3, 2, 1);
            hand_case_f(major, descrs[k], 1, 4, 2, 1);
            hand_case_f(major, descrs[k], 4, 1, 2, 1);
            hand_case_f(major, descrs[k], 6, 1, 1, 1);
            hand_case_f(major, descrs[k], 0, 3, 2, 1);
        }
    hand_case_f(1, "<f8", 1001, 7, 2, 1);
    hand_case_f(1, ">f4", 3, 2999, 2, 1);
    hand_case_f(2, "<i2", 4099, 3, 2, 1);
    /* float16 special values: infinities and NaN (not drawn above) */
    {
        buf b = {0};
        qk_array a;
        qk_result r;
        npy_header(&b, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }");
        put_uint(&b, 0x7c00, 2, 0); put_uint(&b, 0xfc00, 2, 0); put_uint(&b, 0x7e00, 2, 0); put_uint(&b, 0x3c00, 2, 0);
        qk_test_write_file(tpath("f2.npy"), b.p, b.n);
        r = qk_npy_read(tpath("f2.npy"), &a);
        CHECK(r == QK_OK && isinf(a.data[0]) && a.data[0] > 0 && isinf(a.data[1]) && a.data[1] < 0 && isnan(a.data[2]) &&
              a.data[3] == 1.0, "float16 inf, -inf, nan, 1: %s", qk_last_error());
        if (r == QK_OK) qk_array_free(&a);
        free(b.p);
    }
    /* Key order, double quotes and spacing are free in a Python dict literal. */
    {
        buf b = {0};
        qk_array a;
        qk_result r;
        double v[2] = {1.5, -2.25};
        npy_header(&b, 1, "{ \"shape\" : (2 , 1) , \"fortran_order\":False,'descr':'<f8'}");
        put_uint(&b, bits_f64(v[0]), 8, 0);
        put_uint(&b, bits_f64(v[1]), 8, 0);
        qk_test_write_file(tpath("order.npy"), b.p, b.n);
        r = qk_npy_read(tpath("order.npy"), &a);
        CHECK(r == QK_OK && a.rows == 2 && a.cols == 1 && a.data[0] == 1.5 && a.data[1] == -2.25,
              "free-form dict: %s", qk_last_error());
        if (r == QK_OK) qk_array_free(&a);
        free(b.p);
    }
}

static void test_malformed(void) {
    static const char *ok = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    buf b = {0};
    size_t i;
    npy_header(&b, 1, ok);
    for (i = 0; i < 6 * 8; i++) put(&b, "\0", 1);
    /* b is a valid file: check so, then damage copies of it. */
    bad_case("valid control", b.p, b.n, QK_OK, "");
    bad_case("empty file", b.p, 0, QK_ERROR_FORMAT, "magic");
    {
        unsigned char *c = (unsigned char *)malloc(b.n);
        memcpy(c, b.p, b.n);
        c[1] = 'X';
        bad_case("bad magic", c, b.n, QK_ERROR_FORMAT, "magic");
        memcpy(c, b.p, b.n);
        c[6] = 4;
        bad_case("version 4.0", c, b.n, QK_ERROR_FORMAT, "version");
        free(c);
    }
    bad_case("truncated preamble", b.p, 8, QK_ERROR_FORMAT, "truncated");
    bad_case("truncated header", b.p, 40, QK_ERROR_FORMAT, "truncated");
    bad_case("truncated data", b.p, b.n - 5, QK_ERROR_FORMAT, "truncated");
    bad_dict("more data than the shape", 1, ok, 7 * 8, QK_ERROR_FORMAT, "more data");
    bad_dict("fewer elements than the shape", 2, ok, 5 * 8, QK_ERROR_FORMAT, "truncated");
    bad_dict("fortran order, truncated", 1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", 40,
             QK_ERROR_FORMAT, "truncated");
    bad_dict("fortran order, too long", 1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", 56,
             QK_ERROR_FORMAT, "more data");
    bad_dict("object dtype", 1, "{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", 48, QK_ERROR_FORMAT, "object");
    bad_dict("long double", 1, "{'descr': '<f16', 'fortran_order': False, 'shape': (2, 3), }", 96, QK_ERROR_FORMAT, "long double");
    bad_dict("float8", 1, "{'descr': '<f1', 'fortran_order': False, 'shape': (2, 3), }", 6, QK_ERROR_FORMAT, "<f1");
    bad_dict("bool of 2 bytes", 1, "{'descr': '<b2', 'fortran_order': False, 'shape': (2, 3), }", 12, QK_ERROR_FORMAT, "<b2");
    bad_dict("unicode", 1, "{'descr': '<U3', 'fortran_order': False, 'shape': (2, 3), }", 72, QK_ERROR_FORMAT, "<U3");
    bad_dict("datetime", 1, "{'descr': '<M8[s]', 'fortran_order': False, 'shape': (2, 3), }", 48, QK_ERROR_FORMAT, "M8");
    bad_dict("bad byte order", 1, "{'descr': '!f8', 'fortran_order': False, 'shape': (2, 3), }", 48, QK_ERROR_FORMAT, "!f8");
    bad_dict("empty dtype", 1, "{'descr': '', 'fortran_order': False, 'shape': (2, 3), }", 48, QK_ERROR_FORMAT, "not supported");
    bad_dict("complex128", 3, "{'descr': '<c16', 'fortran_order': False, 'shape': (2, 3), }", 96, QK_ERROR_FORMAT, "<c16");
    bad_dict("structured", 1, "{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2,), }", 16, QK_ERROR_FORMAT, "structured");
    bad_dict("3-D", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3, 4), }", 192, QK_ERROR_FORMAT, "3 dimensions");
    bad_dict("0-D", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 8, QK_ERROR_FORMAT, "0 dimensions");
    bad_dict("no shape", 1, "{'descr': '<f8', 'fortran_order': False, }", 8, QK_ERROR_FORMAT, "shape");
    bad_dict("bad shape entry", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, -3), }", 8, QK_ERROR_FORMAT, "shape");
    bad_dict("not a dict", 1, "['descr', '<f8']", 8, QK_ERROR_FORMAT, "header");
    bad_dict("unknown key", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'x': 1}", 8, QK_ERROR_FORMAT, "'x'");
    bad_dict("shape overflow", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 8,
             QK_ERROR_FORMAT, "too large");
    {
        qk_array a;
        qk_result r = qk_npy_read(tpath("does-not-exist.npy"), &a);
        CHECK(r == QK_ERROR_IO, "missing file: %s", qk_result_string(r));
        CHECK(strstr(qk_last_error(), "does-not-exist.npy") != NULL, "missing file named: %s", qk_last_error());
        CHECK(qk_npy_read(NULL, &a) == QK_ERROR_INVALID_ARGUMENT, "NULL path");
        CHECK(qk_npy_read(tpath("rt.npy"), NULL) == QK_ERROR_INVALID_ARGUMENT, "NULL out");
    }
    free(b.p);
}

static void test_write_errors(void) {
    double v[6] = {1, 2, 3, 4, 5, 6};
    qk_result r;
    char sub[600];
    /* A directory that does not exist. */
    snprintf(sub, sizeof sub, "%s/no-such-dir/K.npy", dir);
    r = qk_npy_write(sub, v, QK_F64, 2, 3);
    CHECK(r == QK_ERROR_IO, "missing dir: %s", qk_result_string(r));
    CHECK(strstr(qk_last_error(), "K.npy") != NULL, "detail names the path: %s", qk_last_error());
    CHECK(!file_exists(sub), "no file in a missing dir");
    /* The target is a directory: the temporary file is written, the rename fails, and the
       temporary file must be gone afterwards. */
    snprintf(sub, sizeof sub, "%s/adir", dir);
    CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
    r = qk_npy_write(sub, v, QK_F64, 2, 3);
    CHECK(r == QK_ERROR_IO, "target is a directory: %s", qk_result_string(r));
    CHECK(strstr(qk_last_error(), "rename") != NULL, "detail says rename: %s", qk_last_error());
    CHECK(qk_test_count_files(dir, ".tmp.") == 0, "temporary file removed after a failed rename");
    /* A read-only directory (root ignores permissions, so only as a normal user). */
    if (geteuid() != 0) {
        snprintf(sub, sizeof sub, "%s/ro", dir);
        CHECK(mkdir(sub, 0555) == 0, "mkdir %s", sub);
        snprintf(sub, sizeof sub, "%s/ro/K.npy", dir);
        r = qk_npy_write(sub, v, QK_F64, 2, 3);
        CHECK(r == QK_ERROR_IO, "read-only dir: %s", qk_result_string(r));
        CHECK(!file_exists(sub), "no file in a read-only dir");
        snprintf(sub, sizeof sub, "%s/ro", dir);
        CHECK(qk_test_count_files(sub, "K.npy") == 0, "nothing at all in the read-only dir");
        rmdir(sub);
    }
    /* An existing file is replaced whole. */
    {
        qk_array a;
        double w[2] = {7, 8};
        CHECK(qk_npy_write(tpath("replace.npy"), v, QK_F64, 2, 3) == QK_OK, "first write");
        CHECK(qk_npy_write(tpath("replace.npy"), w, QK_F64, 2, 0) == QK_OK, "second write");
        r = qk_npy_read(tpath("replace.npy"), &a);
        CHECK(r == QK_OK && a.ndim == 1 && a.rows == 2 && a.data[0] == 7 && a.data[1] == 8, "replaced content");
        if (r == QK_OK) qk_array_free(&a);
    }
    CHECK(qk_npy_write(tpath("x.npy"), v, QK_F64, -1, 3) == QK_ERROR_INVALID_ARGUMENT, "negative rows");
    CHECK(qk_npy_write(tpath("x.npy"), v, QK_F64, 2, -3) == QK_ERROR_INVALID_ARGUMENT, "negative cols");
    CHECK(qk_npy_write(tpath("x.npy"), NULL, QK_F64, 2, 3) == QK_ERROR_INVALID_ARGUMENT, "NULL data");
    CHECK(qk_npy_write(NULL, v, QK_F64, 2, 3) == QK_ERROR_INVALID_ARGUMENT, "NULL path");
    CHECK(qk_npy_write(tpath("x.npy"), v, (qk_dtype)99, 2, 3) == QK_ERROR_INVALID_ARGUMENT, "bad dtype");
    CHECK(!file_exists(tpath("x.npy")), "no file after invalid arguments");
}

static void csv_ok(const char *what, const char *text, int64_t rows, int64_t cols, const double *want) {
    qk_array a;
    qk_result r;
    int64_t i;
    qk_test_write_file(tpath("t.csv"), text, strlen(text));
    r = qk_csv_read(tpath("t.csv"), &a);
    CHECK(r == QK_OK, "%s: %s", what, qk_last_error());
    if (r != QK_OK) return;
    CHECK(a.rows == rows && a.cols == cols && a.ndim == 2, "%s: shape %lld x %lld", what, (long long)a.rows, (long long)a.cols);
    for (i = 0; i < rows * cols && a.rows * a.cols == rows * cols; i++)
        CHECK(a.data[i] == want[i] || (isnan(want[i]) && isnan(a.data[i])), "%s: [%lld] %g != %g", what, (long long)i,
              a.data[i], want[i]);
    qk_array_free(&a);
}
#define csv_bad(what, ...) csv_bad2(what, __VA_ARGS__, NULL)
static void csv_bad2(const char *what, const char *text, const char *sub, const char *sub2, ...) {
    qk_array a;
    qk_result r;
    qk_test_write_file(tpath("t.csv"), text, strlen(text));
    a.data = NULL; a.rows = -3;
    r = qk_csv_read(tpath("t.csv"), &a);
    CHECK(r == QK_ERROR_FORMAT, "%s: %s", what, qk_result_string(r));
    CHECK(strstr(qk_last_error(), sub) != NULL, "%s: detail '%s' lacks '%s'", what, qk_last_error(), sub);
    if (sub2) CHECK(strstr(qk_last_error(), sub2) != NULL, "%s: detail '%s' lacks '%s'", what, qk_last_error(), sub2);
    CHECK(a.rows == -3, "%s: output touched", what);
    if (r == QK_OK) qk_array_free(&a);
}

static void test_csv(void) {
    /* Fresh random values printed with %.17g parse back exactly. */
    char text[4096];
    double want[40];
    size_t len = 0;
    int i, j;
    len += (size_t)snprintf(text + len, sizeof text - len, "a,b,c,d\n");
    for (i = 0; i < 10; i++)
        for (j = 0; j < 4; j++) {
            want[i * 4 + j] = rnd_double();
            len += (size_t)snprintf(text + len, sizeof text - len, "%.17g%s", want[i * 4 + j], j == 3 ? "\n" : ",");
        }
    csv_ok("random with header", text, 10, 4, want);
    csv_ok("random without header", strchr(text, '\n') + 1, 10, 4, want);
    {
        const double w[] = {1, 2, 3, 4.5, -6e-3, 7};
        csv_ok("CRLF, blanks, comments, BOM, no final newline",
               "\xef\xbb\xbfx, y ,z\r\n# a comment\r\n\r\n1, 2,3\r\n  \r\n4.5,-6e-3 ,7", 2, 3, w);
    }
    {
        const double w[] = {1, NAN, 3};
        csv_ok("nan is data (the map check rejects it later, naming row and column)", "1\nnan\n3\n", 3, 1, w);
    }
    csv_bad("ragged row", "a,b\n1,2\n3,4\n5\n", "line 4 has 1 columns, line 2 has 2");
    csv_bad("non-number", "1,2\n3,x7\n", "line 2, column 2: 'x7' is not a number");
    csv_bad("empty field", "1,2\n3,,4\n", "line 2, column 2: empty field");
    csv_bad("header only", "a,b,c\n", "no numeric rows");
    csv_bad("empty file", "", "no numeric rows");
    csv_bad("second line text", "a,b\nc,d\n", "line 2, column 1");
    {
        qk_array a;
        CHECK(qk_csv_read(tpath("nope.csv"), &a) == QK_ERROR_IO, "missing csv");
    }
}

static int printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) return 0;
    return 1;
}

/* Issue 14: a header that claims more data than the file holds is refused before the data is
   allocated (it used to malloc the claimed 48 GB first); damaged header bytes are quoted
   escaped (they used to reach the terminal raw). */
static void test_npy_hardening(void) {
    buf b = {0};
    size_t i;
    npy_header(&b, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3000000000), }");
    for (i = 0; i < 72; i++) put(&b, "\0", 1);
    g_alloc_max = 0;
    bad_case("header claims 48 GB, file has 72 bytes", b.p, b.n, QK_ERROR_FORMAT, "truncated data: 72 of 48000000000 bytes");
    CHECK(g_alloc_max < 4096, "%lu bytes allocated for a file of %lu", (unsigned long)g_alloc_max, (unsigned long)b.n);
    free(b.p);
    memset(&b, 0, sizeof b);
    npy_header(&b, 3, "{'descr': '>i4', 'fortran_order': False, 'shape': (100000000,), }");
    g_alloc_max = 0;
    bad_case("1-D header claims 400 MB", b.p, b.n, QK_ERROR_FORMAT, "shape (100000000,)");
    CHECK(g_alloc_max < 4096, "%lu bytes allocated", (unsigned long)g_alloc_max);
    free(b.p);
    /* damaged header bytes: escape sequences (ESC, CSI), a NUL, bytes >= 0x80 */
    {
        static const char *dicts[] = {
            "{'\x1b\x9b" "31m': '<f8', 'fortran_order': False, 'shape': (1,), }",
            "\x1b]0;title\x07{'descr': '<f8'}",
            "{'descr' \x01\xff 'x'}",
            "{'descr': '\x1b[2J<f8', 'fortran_order': False, 'shape': (1,), }",
        };
        for (i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
            qk_array a;
            qk_result r;
            memset(&b, 0, sizeof b);
            npy_header(&b, 1, dicts[i]);
            put(&b, "\0\0\0\0\0\0\0\0", 8);
            qk_test_write_file(tpath("dmg.npy"), b.p, b.n);
            r = qk_npy_read(tpath("dmg.npy"), &a);
            CHECK(r == QK_ERROR_FORMAT, "damaged header %lu: %s", (unsigned long)i, qk_result_string(r));
            CHECK(printable(qk_last_error()), "damaged header %lu: raw bytes in '%s'", (unsigned long)i, qk_last_error());
            CHECK(i != 0 || strstr(qk_last_error(), "\\x1b\\x9b31m") != NULL, "escaped key: %s", qk_last_error());
            CHECK(i != 3 || strstr(qk_last_error(), "\\x1b[2J<f8") != NULL, "escaped descr: %s", qk_last_error());
            free(b.p);
        }
    }
}

/* FIFOs, devices and directories are refused at once (a FIFO used to block open() forever,
   /dev/zero linked as z.csv to be read without limit). main's alarm turns a hang into a failure. */
static void test_not_regular(void) {
    static const char *exts[] = {"npy", "csv"};
    int k;
    for (k = 0; k < 2; k++) {
        char p[600];
        qk_array a;
        qk_result r;
        snprintf(p, sizeof p, "%s/fifo.%s", dir, exts[k]);
        CHECK(mkfifo(p, 0600) == 0, "mkfifo %s", p);
        a.rows = -5;
        r = k ? qk_csv_read(p, &a) : qk_npy_read(p, &a);
        CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "FIFO") && a.rows == -5, "FIFO .%s: %s (%s)", exts[k],
              qk_result_string(r), qk_last_error());
        remove(p);
        if (file_exists("/dev/zero")) {
            snprintf(p, sizeof p, "%s/z.%s", dir, exts[k]);
            CHECK(symlink("/dev/zero", p) == 0, "symlink %s", p);
            r = k ? qk_csv_read(p, &a) : qk_npy_read(p, &a);
            CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "character device"), "/dev/zero as .%s: %s", exts[k], qk_last_error());
            remove(p);
        }
        snprintf(p, sizeof p, "%s/d.%s", dir, exts[k]);
        CHECK(mkdir(p, 0700) == 0, "mkdir %s", p);
        r = k ? qk_csv_read(p, &a) : qk_npy_read(p, &a);
        CHECK(r == QK_ERROR_IO && strstr(qk_last_error(), "directory"), "directory .%s: %s", exts[k], qk_last_error());
        rmdir(p);
    }
}

static void csv_bad_n(const char *what, const char *text, size_t n, const char *sub, const char *sub2) {
    qk_array a;
    qk_result r;
    qk_test_write_file(tpath("t.csv"), text, n);
    a.data = NULL; a.rows = -3;
    r = qk_csv_read(tpath("t.csv"), &a);
    CHECK(r == QK_ERROR_FORMAT, "%s: %s", what, qk_result_string(r));
    CHECK(strstr(qk_last_error(), sub) != NULL, "%s: detail '%s' lacks '%s'", what, qk_last_error(), sub);
    if (sub2) CHECK(strstr(qk_last_error(), sub2) != NULL, "%s: detail '%s' lacks '%s'", what, qk_last_error(), sub2);
    CHECK(printable(qk_last_error()), "%s: raw bytes in '%s'", what, qk_last_error());
    CHECK(a.rows == -3, "%s: output touched", what);
    if (r == QK_OK) qk_array_free(&a);
}

/* Issue 14 and 16: the CSV reader never drops data silently, reads numbers of any length and
   says what is wrong with a semicolon, tab or pandas file. */
static void test_csv_hardening(void) {
    static const char nul1[] = "1,\0 2\n3,4\n", nul2[] = "1,2\n3,\0 4\n";
    char text[70000];
    size_t i;
    csv_bad_n("NUL in the first line (it used to be a header, dropped)", nul1, sizeof nul1 - 1, "line 1", "control byte \\0");
    csv_bad_n("NUL in a data line", nul2, sizeof nul2 - 1, "line 2, byte 3", "\\0");
    csv_bad("escape byte", "x\x1by\n1\n", "line 1, byte 2");
    csv_bad("DEL byte", "1,2\n3,\x7f\n", "line 2");
    csv_bad("old Mac line ends", "1,2\r3,4\r", "\\r");
    csv_bad("empty first field (it used to make a header)", ",2\n3,4\n", "line 1, column 1: empty field");
    csv_bad("pandas index column", ",a,b\n0,1.5,2.5\n1,3,4\n", "to_csv");
    csv_bad("unnamed header column", "a,,b\n1,2,3\n", "line 1 (the header), column 2 has no name");
    csv_bad("header names fewer columns", "a,b\n1,2,3\n", "line 2 has 3 columns, the header (line 1) names 2");
    csv_bad("semicolons (German Excel)", "1;2\n3;4\n", "line 1, column 1", "';'");
    csv_bad("semicolons and decimal commas", "a;b\n5,1;3,5\n", "line 2, column 2: '1;3'", "semicolon");
    csv_bad("tabs", "1\t2\n3\t4\n", "line 1, column 1", "tab");
    csv_bad("a header field that starts like a number", "x1,2nd\n1,2\n", "line 1, column 1: 'x1'", "header");
    csv_bad("out of range", "1,1e999\n", "line 1, column 2: '1e999' is out of range");
    csv_bad("hex is not C-syntax decimal", "0x10\n", "'0x10' is not a number");
    {
        const double w[] = {NAN, NAN, 1, 2};
        csv_ok("nan,nan is data, not a header", "nan,nan\n1,2\n", 2, 2, w);
    }
    {
        const double w[] = {1, 2};
        csv_ok("a header field like inf_rate is a name", "inf_rate,b\n1,2\n", 1, 2, w);
    }
    /* Issue 27, item 3: a first line is a header only when it reads as names; quoted numbers are
       numbers; anything else (NA, a U+2212 minus) is an error, never a dropped first row. */
    {
        const double w[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
        csv_ok("quoted numbers on line 1 are data", "\"0.1\",\"0.2\"\n0.3,0.4\n0.5,0.6\n", 3, 2, w);
        csv_ok("quoted numbers on every line", " \"0.1\" ,\" 0.2\"\n\"0.3\",0.4\n0.5,\"0.6\"\n", 3, 2, w);
        csv_ok("quoted names are a header", "\"x\",\"y z\"\n0.1,0.2\n0.3,0.4\n0.5,0.6\n", 3, 2, w);
        csv_ok("non-ASCII names are a header", "temp\xc3\xa9rature,\xce\x94t\n0.1,0.2\n0.3,0.4\n0.5,0.6\n", 3, 2, w);
        csv_ok("_ starts a name", "_a,b_1\n0.1,0.2\n0.3,0.4\n0.5,0.6\n", 3, 2, w);
    }
    csv_bad("NA,NA on line 1", "NA,NA\n0.3,0.4\n", "line 1, column 1: 'NA' is not a number", "missing value");
    csv_bad("N/A and null on line 1", "N/A,null\n0.3,0.4\n", "line 1, column 1: 'N/A' is not a number");
    csv_bad("a name and NA on line 1", "x,NA\n0.3,0.4\n", "line 1, column 1: 'x' is not a number", "header");
    csv_bad("quoted NA on line 1", "\"NA\",\"NA\"\n0.3,0.4\n", "line 1, column 1: '\"NA\"' is not a number");
    csv_bad("U+2212 minus on line 1", "\xe2\x88\x92" "0.1,\xe2\x88\x92" "0.2\n0.3,0.4\n", "line 1, column 1: '\\xe2\\x88\\x920.1'", "U+2212");
    csv_bad("U+2212 minus on line 2", "0.1,0.2\n0.3,\xe2\x88\x92" "0.4\n", "line 2, column 2", "U+2212");
    csv_bad("an en dash on line 1", "\xe2\x80\x93" "1,2\n3,4\n", "line 1, column 1");
    csv_bad("fullwidth digits on line 1", "\xef\xbc\x91,2\n3,4\n", "line 1, column 1");
    csv_bad("R's write.csv row names", "\"\",\"x\",\"y\"\n\"1\",0.1,0.2\n\"2\",0.3,0.4\n",
            "line 1 (the header), column 1 has no name", "row.names = FALSE");
    csv_bad("an unbalanced quote", "\"0.1,0.2\n0.3,0.4\n", "line 1, column 1: '\"0.1' is not a number");
    csv_bad("an empty quoted field", "0.1,\"\"\n0.3,0.4\n", "line 1, column 2: empty field");
    /* numbers of any length (it used to be "is not a number" beyond ~80 characters) */
    {
        double w[3];
        size_t n = 0;
        n += (size_t)snprintf(text + n, sizeof text - n, "0.");
        for (i = 0; i < 400; i++) text[n++] = '3';
        text[n++] = ',';
        text[n++] = '1';
        for (i = 0; i < 400; i++) text[n++] = '0';
        n += (size_t)snprintf(text + n, sizeof text - n, "e-400,0.");
        for (i = 0; i < 398; i++) text[n++] = '0';
        n += (size_t)snprintf(text + n, sizeof text - n, "1\n");
        w[0] = 1.0 / 3.0;   /* the double nearest 0.333...3 (400 digits) is the one nearest 1/3 */
        w[1] = 1.0;
        w[2] = 0.0;         /* 1e-399 rounds to zero */
        csv_ok("400-digit numbers", text, 1, 3, w);
    }
    /* the bounds (QK_CSV_MAX_LINE and QK_CSV_MAX_BYTES, made small above) */
    memset(text, '1', 9000);
    memcpy(text + 9000, "\n", 2);
    csv_bad("line over QK_CSV_MAX_LINE", text, "line 1 is longer than QK_CSV_MAX_LINE");
    for (i = 0; i + 2 < 66000; i += 2) memcpy(text + i, "1\n", 2);
    text[i] = 0;
    csv_bad("file over QK_CSV_MAX_BYTES", text, "QK_CSV_MAX_BYTES");
}

/* Issue 27, item 10: a path or spec the message quotes reaches a terminal as text: control and
   non-ASCII bytes escaped (a file name with ESC [2J used to clear the screen), a long spec cut
   with its size. */
static void test_escaped_echoes(void) {
    char p[600], big[130000];
    qk_array a;
    qk_map *m = NULL;
    snprintf(p, sizeof p, "%s/ok\x1b[2J\x9b\xc3\xa9.npy", dir);
    CHECK(qk_npy_read(p, &a) == QK_ERROR_IO, "missing file with ESC in its name");
    CHECK(printable(qk_last_error()) && strstr(qk_last_error(), "ok\\x1b[2J\\x9b\\xc3\\xa9.npy"), "raw bytes: '%s'",
          qk_last_error());
    snprintf(p, sizeof p, "%s/ok\x1b[2J.csv", dir);
    CHECK(qk_csv_read(p, &a) == QK_ERROR_IO && printable(qk_last_error()), "csv: '%s'", qk_last_error());
    {
        double one = 1.0;
        snprintf(p, sizeof p, "%s/no\x1b[2J-dir/K.npy", dir);
        CHECK(qk_npy_write(p, &one, QK_F64, 1, 1) == QK_ERROR_IO, "write into a missing directory");
        CHECK(printable(qk_last_error()) && strstr(qk_last_error(), "no\\x1b[2J-dir"), "write: '%s'", qk_last_error());
    }
    memcpy(big, "zz(", 3);
    memset(big + 3, 'a', 120000);
    memcpy(big + 120003, ")", 2);
    CHECK(qk_map_parse(big, 2, &m) == QK_ERROR_PARSE && m == NULL, "long spec");
    CHECK(strlen(qk_last_error()) < 512 && strstr(qk_last_error(), "... (120004 bytes)"), "long spec: '%s'", qk_last_error());
    CHECK(qk_map_parse("zz\x1b[2J", 2, &m) == QK_ERROR_PARSE && printable(qk_last_error()), "'%s'", qk_last_error());
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    qk_test_seed();
    snprintf(dir, sizeof dir, "%s/qk-test-npy-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }

    test_round_trips();
    test_hand_written();
    test_malformed();
    test_write_errors();
    test_csv();
    alarm(60);   /* a reader that blocks (a FIFO) fails the test instead of hanging it */
    test_npy_hardening();
    test_not_regular();
    test_csv_hardening();
    test_escaped_echoes();

    if (qk_test_fails == 0) {
        /* Clean up only on success, so a failure leaves its files to look at. */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
        printf("test_npy: all checks passed\n");
        return 0;
    }
    printf("test_npy: %d checks FAILED (files kept in %s)\n", qk_test_fails, dir);
    return 1;
}
