/* Fuzz target for the .npy reader (qk_npy_read): the input is written to a scratch file (in
   /dev/shm where it exists) and read back through the real file path (open, fstat, read).
   Property checked on every input: no crash, out-of-bounds access or leak (ASan/UBSan/LSan);
   a refused file gets QK_ERROR_FORMAT (or IO / out of memory) with a message of printable ASCII
   only (header bytes are quoted escaped) and the caller's array untouched; an accepted one is
   1-D or 2-D, its data size is exactly what the file holds after the header (4 or 8 bytes per
   element), and writing its values with qk_npy_write and reading them again gives the same
   bits (a round trip through the writer). The states reader (qk_npy_read_states) reads the
   same input: refused as above with the caller's struct untouched, or (n, dim) / (n, dim, dim)
   elements whose bytes in the file are exactly what follows the header.

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_npy_read.c -lm -pthread -o /tmp/fuzz_npy_read
     /tmp/fuzz_npy_read -runs=1000000 -dict=tests/fuzz/fuzz_npy_read.dict /tmp/corpus-npy
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "fuzz_common.h"

static const char *fz_token(int i) {
    static const char *const t[] = {
        "\x93NUMPY", "\x01", "\x02", "\x03", "{", "}", "'", "\"", ":", ",", "(", ")", " ", "\n", "descr", "'descr': ",
        "'fortran_order': ", "'shape': ", "True", "False", "<f8", ">f4", "<i4", ">i8", "|O", "<c16", "[('a', '<f8')]",
        "99999999999", "9223372036854775807", "3000000000", "0", "1,", "L", "\xff", "", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

/* A valid file: version v, descr d, shape (r, c) (c < 0: 1-D), data bytes of a pattern. */
static size_t npy_file(unsigned char *buf, size_t cap, int v, const char *d, int r, int c) {
    char dict[160];
    size_t pre = v == 1 ? 10 : 12, dl, total, i, isz = (size_t)(d[2] - '0'), n = (size_t)r * (size_t)(c < 0 ? 1 : c) * isz;
    if (c < 0) snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }", d, r);
    else snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }", d, r, c);
    dl = strlen(dict);
    total = (pre + dl + 1 + 63) / 64 * 64;
    if (total + n > cap) return 0;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)v;
    buf[7] = 0;
    for (i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)((total - pre) >> (8 * i));
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', total - pre - dl - 1);
    buf[total - 1] = '\n';
    for (i = 0; i < n; i++) buf[total + i] = (unsigned char)(i * 37 + 11);
    return total + n;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    switch (i) {
    case 0: return npy_file(buf, cap, 1, "<f8", 3, 2);
    case 1: return npy_file(buf, cap, 2, ">f4", 5, -1);
    case 2: return npy_file(buf, cap, 3, "<i4", 2, 3);
    case 3: return npy_file(buf, cap, 1, ">i8", 0, 4);
    case 4: return npy_file(buf, cap, 1, "<f8", 4, 0);
    case 5: return npy_file(buf, cap, 1, "=f8", 1, 1);
    case 6: return npy_file(buf, cap, 1, "<c8", 3, 4);
    case 7: return npy_file(buf, cap, 2, ">c8", 2, 2);
    default: return 0;
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    const char *p = fz_path(".npy"), *p2 = fz_path(".out.npy");
    qk_array a, b;
    qk_result r;
    fz_write(p, data, size);
    {
        qk_states_array s;
        s.data = (void *)(uintptr_t)0x40; s.n = -1; s.dim = -2; s.mixed = -3; s.type = (qk_state_type)77;
        r = qk_npy_read_states(p, &s);
        if (r != QK_OK) {
            FZ_CHECK(r == QK_ERROR_FORMAT || r == QK_ERROR_IO || r == QK_ERROR_OUT_OF_MEMORY);
            FZ_CHECK(qk_last_error()[0] && fz_printable(qk_last_error()));
            FZ_CHECK(s.data == (void *)(uintptr_t)0x40 && s.n == -1 && s.dim == -2 && s.mixed == -3 && (int)s.type == 77);
        } else {
            /* the elements: 1 to 16 bytes each in the file, nothing more */
            uint64_t n = (uint64_t)s.n * (uint64_t)s.dim * (uint64_t)(s.mixed ? s.dim : 1);
            size_t hlen = data[6] == 1 ? (size_t)data[8] | ((size_t)data[9] << 8)
                                       : (size_t)data[8] | ((size_t)data[9] << 8) | ((size_t)data[10] << 16) | ((size_t)data[11] << 24);
            uint64_t tail = (uint64_t)size - (data[6] == 1 ? 10 : 12) - hlen;
            FZ_CHECK(s.data != NULL && s.n >= 0 && s.dim >= 0 && (s.mixed == 0 || s.mixed == 1));
            FZ_CHECK(s.type >= QK_STATE_C128 && s.type <= QK_STATE_F32);
            FZ_CHECK(tail == n || tail == 2 * n || tail == 4 * n || tail == 8 * n || tail == 16 * n);
            qk_states_array_free(&s);
            FZ_CHECK(s.data == NULL);
        }
    }
    a.data = (double *)(uintptr_t)0x40; a.rows = -1; a.cols = -2; a.ndim = -3;
    r = qk_npy_read(p, &a);
    if (r != QK_OK) {
        FZ_CHECK(r == QK_ERROR_FORMAT || r == QK_ERROR_IO || r == QK_ERROR_OUT_OF_MEMORY);
        FZ_CHECK(qk_last_error()[0] && fz_printable(qk_last_error()));
        FZ_CHECK(a.data == (double *)(uintptr_t)0x40 && a.rows == -1 && a.cols == -2 && a.ndim == -3);
        return 0;
    }
    FZ_CHECK(a.data != NULL && (a.ndim == 1 || a.ndim == 2) && a.rows >= 0 && a.cols >= 0);
    FZ_CHECK(a.ndim == 2 || a.cols == 1);
    {
        /* the data is the file's tail: 1, 2, 4 or 8 bytes per element (the dtypes qk_npy_read
           takes), nothing more */
        uint64_t n = (uint64_t)a.rows * (uint64_t)a.cols;
        size_t hlen = data[6] == 1 ? (size_t)data[8] | ((size_t)data[9] << 8)
                                   : (size_t)data[8] | ((size_t)data[9] << 8) | ((size_t)data[10] << 16) | ((size_t)data[11] << 24);
        uint64_t tail = (uint64_t)size - (data[6] == 1 ? 10 : 12) - hlen;
        FZ_CHECK(tail == n || tail == 2 * n || tail == 4 * n || tail == 8 * n);
    }
    if (a.ndim == 2 && a.cols == 0) {   /* (r, 0): qk_npy_write's cols == 0 means 1-D, so no round trip */
        qk_array_free(&a);
        return 0;
    }
    r = qk_npy_write(p2, a.data, QK_F64, a.rows, a.ndim == 2 ? a.cols : 0);
    FZ_CHECK(r == QK_OK);
    r = qk_npy_read(p2, &b);
    FZ_CHECK(r == QK_OK && b.rows == a.rows && b.cols == a.cols && b.ndim == a.ndim);
    FZ_CHECK(memcmp(a.data, b.data, sizeof(double) * (size_t)(a.rows * a.cols)) == 0);
    qk_array_free(&a);
    qk_array_free(&b);
    return 0;
}
