/* Fuzz target for the .csv reader (qk_csv_read): the input is written to a scratch file and read
   through the real file path. Property checked on every input: no crash, out-of-bounds access or
   leak (ASan/UBSan/LSan); a refused file gets QK_ERROR_FORMAT (or IO / out of memory) with a
   message of printable ASCII only (file content is quoted escaped) and the caller's array
   untouched; an accepted one holds no control byte but tab and line ends (a NUL or any other
   one is an error, never data silently dropped), has at most one row per line, and its values
   written back as text ("%.17g", '.' decimals) read back to the same bits. It runs in the
   de_DE.UTF-8 locale when the machine has it: the reader must not care.

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_csv_read.c -lm -pthread -o /tmp/fuzz_csv_read
     /tmp/fuzz_csv_read -runs=1000000 -dict=tests/fuzz/fuzz_csv_read.dict /tmp/corpus-csv
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_IMPLEMENTATION
#include "qk.h"
#include "fuzz_common.h"

#include <locale.h>

static const char *fz_token(int i) {
    static const char *const t[] = {",", "\n", "\r\n", "\r", " ", "\t", "#", ";", ".", "-", "+", "e", "E", "e-308", "1e309",
                                    "nan", "-inf", "Infinity", "0x1p3", "\xef\xbb\xbf", "\xc3\xa9", "a", "x,y", ",a,b\n",
                                    "0.000000000000000000000000000000000000000000000000000000000001", "\x7f", "\x01", "", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    static const char *const seeds[] = {
        "a,b,c\n1,2,3\n4.5,-6e-3,7\n",
        "\xef\xbb\xbfx, y\r\n# comment\r\n\r\n1, 2\r\n3 ,4",
        "1\nnan\n-inf\n",
        "0.1,0.2,0.30000000000000004,1e-320,1.7976931348623157e308\n",
        "5.1,3.5,1.4,0.2,0\n4.9,3.0,1.4,0.2,0\n",
    };
    size_t n;
    if (i >= (int)(sizeof seeds / sizeof seeds[0])) return 0;
    n = strlen(seeds[i]);
    if (n > cap) return 0;
    memcpy(buf, seeds[i], n);
    return n;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static int init = 0;
    const char *p = fz_path(".csv"), *p2 = fz_path(".re.csv");
    qk_array a, b;
    qk_result r;
    size_t i, lines = 1;
    if (!init) {
        init = 1;
        setlocale(LC_ALL, "de_DE.UTF-8");   /* stays "C" where the locale is missing */
    }
    fz_write(p, data, size);
    a.data = (double *)(uintptr_t)0x40; a.rows = -1; a.cols = -2; a.ndim = -3;
    r = qk_csv_read(p, &a);
    if (r != QK_OK) {
        FZ_CHECK(r == QK_ERROR_FORMAT || r == QK_ERROR_IO || r == QK_ERROR_OUT_OF_MEMORY);
        FZ_CHECK(qk_last_error()[0] && fz_printable(qk_last_error()));
        FZ_CHECK(a.data == (double *)(uintptr_t)0x40 && a.rows == -1 && a.cols == -2 && a.ndim == -3);
        return 0;
    }
    for (i = 0; i < size; i++) {
        unsigned char c = data[i];
        FZ_CHECK(!((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f));
        lines += c == '\n';
    }
    FZ_CHECK(a.ndim == 2 && a.rows >= 1 && a.cols >= 1 && (size_t)a.rows <= lines && a.data != NULL);
    {
        /* written back in C syntax and read again: the same values, bit for bit */
        FILE *f = fopen(p2, "wb");
        int64_t k, n = a.rows * a.cols;
        FZ_CHECK(f != NULL);
        for (k = 0; k < n; k++) {
            char num[64];
            fprintf(f, "%s%s", qk__fmt_g(num, sizeof num, a.data[k], 17), (k + 1) % a.cols ? "," : "\n");
        }
        FZ_CHECK(fclose(f) == 0);
        r = qk_csv_read(p2, &b);
        if (r != QK_OK) fprintf(stderr, "rewritten file refused: %s\n", qk_last_error());
        FZ_CHECK(r == QK_OK && b.rows == a.rows && b.cols == a.cols);
        for (k = 0; k < n; k++)
            FZ_CHECK(memcmp(&a.data[k], &b.data[k], sizeof(double)) == 0 || (a.data[k] != a.data[k] && b.data[k] != b.data[k]));
        qk_array_free(&b);
    }
    qk_array_free(&a);
    return 0;
}
