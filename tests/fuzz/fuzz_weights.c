/* Fuzz target for qk-gram's weights reader (read_weights in src/cli/qk-gram.c: --weights, a .npy
   or .csv file whose values, in row-major order, become the map's trainable weights). The first
   input byte picks the map's weight count (1..4); the rest is the file, a .npy when it starts with
   the .npy magic, else a .csv. Property checked on every input: no crash, out-of-bounds access or
   leak (ASan/UBSan/LSan); a refused file leaves every weight at 1.0; an accepted one sets exactly
   the values the file holds (read again with qk_npy_read / qk_csv_read), all finite.

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_weights.c -lm -pthread -o /tmp/fuzz_weights
     /tmp/fuzz_weights -runs=1000000 -dict=tests/fuzz/fuzz_csv_read.dict /tmp/corpus-weights
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_GRAM_NO_MAIN
#include "../../src/cli/qk-gram.c"
#include "fuzz_common.h"

/* the rest of qk-gram stays referenced by qk-gram.c itself (its QK_GRAM_NO_MAIN branch) */

static const char *fz_token(int i) {
    static const char *const t[] = {",", "\n", "\r\n", " ", "#", ".", "-", "e308", "nan", "inf", "a,b\n", "\x93NUMPY\x01",
                                    "'shape': (2, 2), ", "'descr': '<f4', ", "<i8", "", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    static const char dict[] = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
    static const char *const csv[] = {"\x02" "0.5,-1.25\n", "\x03" "w0,w1,w2\n1,2,3\n", "\x04" "1,2\n3,4\n", "\x01" "1e308\n"};
    size_t n, total;
    double v[2] = {0.25, -3.5};
    if (i < 4) {
        n = strlen(csv[i]);
        if (n > cap) return 0;
        memcpy(buf, csv[i], n);
        return n;
    }
    if (i > 4) return 0;
    /* a .npy of two float64 weights (native order, as qk_npy_write writes) */
    total = 1 + 64 + sizeof v;
    if (total > cap) return 0;
    buf[0] = 2;
    memcpy(buf + 1, "\x93NUMPY\x01\x00", 8);
    buf[9] = 64 - 10;
    buf[10] = 0;
    memset(buf + 11, ' ', 64 - 10);
    memcpy(buf + 11, dict, sizeof dict - 1);
    buf[64] = '\n';
    memcpy(buf + 65, v, sizeof v);
    return total;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    qk_map_desc d;
    qk_op ops[4];
    qk_map *map = NULL;
    qk_array a;
    const char *p;
    int nw, k, rc;
    if (size < 1) return 0;
    quiet_msgs = 1;
    nw = 1 + data[0] % 4;
    memset(&d, 0, sizeof d);
    for (k = 0; k < nw; k++) {
        memset(&ops[k], 0, sizeof ops[k]);
        ops[k].kind = QK_OP_RY;
        ops[k].angle.kind = QK_ARG_W;
        ops[k].angle.w = k;
        ops[k].angle.scale = 1.0;
    }
    d.type = QK_MAP_CUSTOM;
    d.n_features = 1;
    d.n_qubits = 1;
    d.ops = ops;
    d.n_ops = nw;
    d.n_weights = nw;
    FZ_CHECK(qk_map_make(&d, &map) == QK_OK);
    p = size >= 7 && memcmp(data + 1, "\x93NUMPY", 6) == 0 ? fz_path(".npy") : fz_path(".csv");
    fz_write(p, data + 1, size - 1);
    rc = read_weights(p, map, 1);
    if (rc != EXIT_SUCCESS) {
        FZ_CHECK(rc == EXIT_FAILURE);
        for (k = 0; k < nw; k++) FZ_CHECK(map->weights[k] == 1.0);
    } else {
        FZ_CHECK(read_array(p, &a) == QK_OK && a.rows * a.cols == nw);
        for (k = 0; k < nw; k++) FZ_CHECK(map->weights[k] == a.data[k] && isfinite(a.data[k]));
        qk_array_free(&a);
    }
    qk_map_free(map);
    return 0;
}
