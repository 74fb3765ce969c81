/* Fuzz target for the autotune cache's JSON reader (qk__tune_parse in qk.h).
   Property checked on every input: the reader never crashes, reads out of bounds or leaks
   (ASan/UBSan/LeakSanitizer); when it accepts a file, every entry is valid (strings terminated
   and valid UTF-8, enums and qubits in range, metric finite) and the writer's text of those
   entries reads back to the same entries (a second write is byte-identical); when it refuses
   one, it says why.

   libFuzzer (clang), from the repository root (docs/autotune.md):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_tune_json.c -o /tmp/fuzz_tune_json
     /tmp/fuzz_tune_json -runs=1000000 -dict=tests/fuzz/fuzz_tune_json.dict /tmp/corpus tests/fuzz/fuzz_tune_json_seeds
   Built with -DQK_FUZZ_STANDALONE (any compiler; the meson test fuzz_tune_json_smoke) it has its
   own main: the seeds below plus random mutations of them, a fixed count, for CI. */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_tune_json: %s failed at line %d\n", #c, __LINE__); \
                         abort(); } } while (0)

static int valid_str(const char *s, size_t cap) {
    size_t n, i = 0;
    if (!memchr(s, 0, cap)) return 0;
    n = strlen(s);
    while (i < n) {
        size_t k = qk__utf8_seq((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static int same(const qk_tune_entry *a, const qk_tune_entry *b) {
    return qk__tune_key_eq(&a->key, &b->key) && !strcmp(a->config, b->config) &&
           memcmp(&a->metric, &b->metric, sizeof a->metric) == 0 && a->timestamp == b->timestamp;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    qk_tune_entry *v = NULL, *w = NULL;
    int n = 0, m = 0, i;
    char why[256];
    qk__tbuf b, b2;
    qk_result r;
    why[0] = 0;
    r = qk__tune_parse((const char *)data, size, &v, &n, why, sizeof why);
    if (r != QK_OK) {
        FZ_CHECK(r == QK_ERROR_FORMAT && why[0] && v == NULL && n == 0);
        return 0;
    }
    FZ_CHECK(n >= 0 && n <= QK_TUNE_CACHE_MAX_ENTRIES && (n == 0) == (v == NULL));
    for (i = 0; i < n; i++) {
        const qk_tune_entry *e = &v[i];
        FZ_CHECK(valid_str(e->key.device, sizeof e->key.device));
        FZ_CHECK(valid_str(e->key.qk_version, sizeof e->key.qk_version) && e->key.qk_version[0]);
        FZ_CHECK(valid_str(e->key.kernel, sizeof e->key.kernel) && e->key.kernel[0]);
        FZ_CHECK(valid_str(e->config, sizeof e->config) && e->config[0]);
        FZ_CHECK(e->key.path >= QK_PATH_ANALYTIC && e->key.path <= QK_PATH_COMPLEX);
        FZ_CHECK((int)e->key.precision >= 0 && (int)e->key.precision < QK_PRECISION_COUNT);
        FZ_CHECK(e->key.n_qubits >= 1 && e->key.n_qubits <= QK_MAX_PRODUCT_QUBITS);
        FZ_CHECK(e->metric - e->metric == 0.0);
    }
    memset(&b, 0, sizeof b);
    memset(&b2, 0, sizeof b2);
    FZ_CHECK(qk__tune_format(v, n, &b));
    r = qk__tune_parse(b.p, b.len, &w, &m, why, sizeof why);
    if (r != QK_OK) fprintf(stderr, "rewritten file refused: %s\n%s\n", why, b.p);
    FZ_CHECK(r == QK_OK && m == n);
    for (i = 0; i < n; i++) FZ_CHECK(same(&v[i], &w[i]));
    FZ_CHECK(qk__tune_format(w, m, &b2));
    FZ_CHECK(b.len == b2.len && memcmp(b.p, b2.p, b.len) == 0);
    QK_FREE(b.p);
    QK_FREE(b2.p);
    QK_FREE(v);
    QK_FREE(w);
    return 0;
}

#ifdef QK_FUZZ_STANDALONE
/* Seeds: a real file, escapes, unknown fields, and near misses. */
static const char *const fz_seeds[] = {
    "{\n  \"schema\": 1,\n  \"qk\": \"0.1.0\",\n  \"entries\": [\n    {\"device\": \"NVIDIA H200\", \"cc_major\": 9, "
    "\"cc_minor\": 0, \"driver\": 12080, \"qk\": \"0.1.0\", \"kernel\": \"gram\", \"path\": \"complex\", \"precision\": "
    "\"fp32\", \"qubits\": 12, \"config\": \"tm=128,tn=64\", \"metric\": 3.25, \"timestamp\": 1763766000},\n    "
    "{\"device\": \"NVIDIA H100 80GB HBM3\", \"cc_major\": 9, \"cc_minor\": 0, \"driver\": 12040, \"qk\": \"0.1.0\", "
    "\"kernel\": \"states\", \"path\": \"real\", \"precision\": \"fp64\", \"qubits\": 4096, \"config\": \"b=256\", "
    "\"metric\": -1.5e-300, \"timestamp\": -9223372036854775808}\n  ]\n}\n",
    "{\"entries\":[{\"timestamp\":0,\"metric\":0,\"config\":\"\\u00e9\\ud83d\\ude80\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"qubits\":1,"
    "\"precision\":\"default\",\"path\":\"analytic\",\"kernel\":\"\",\"qk\":\"\",\"driver\":-1,\"cc_minor\":0,\"cc_major\":0,"
    "\"device\":\"\",\"x\":{\"y\":[null,true,false,1e5,\"z\"]}}],\"schema\":1,\"other\":{}}",
    "{\"schema\": 2, \"entries\": []}",
    "{\"schema\": 1, \"entries\": [{}]}",
    "[1, 2.5, -3e-2, \"s\", {\"a\": [[]]}]",
};

static unsigned long long fz_rng = 88172645463325252ull;
static unsigned fz_rand(void) { fz_rng ^= fz_rng << 13; fz_rng ^= fz_rng >> 7; fz_rng ^= fz_rng << 17; return (unsigned)(fz_rng >> 11); }

int main(int argc, char **argv) {
    static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "0", "-", "1e9",
                                         ".", "true", "null", "\"schema\"", "\"entries\"", "\"qubits\"", "\xc3", "\xe9",
                                         "\xf0\x9f\x9a\x80", " ", "\n", "\x00", "4096", "9223372036854775808"};
    long iters = argc > 1 ? atol(argv[1]) : 200000, it;
    size_t ns = sizeof fz_seeds / sizeof fz_seeds[0], nt = sizeof tokens / sizeof tokens[0];
    unsigned char *buf = (unsigned char *)malloc(1 << 16);
    size_t i;
    for (i = 0; i < ns; i++) LLVMFuzzerTestOneInput((const unsigned char *)fz_seeds[i], strlen(fz_seeds[i]));
    for (it = 0; it < iters; it++) {
        const char *s = fz_seeds[fz_rand() % ns];
        size_t len = strlen(s), k, nmut = 1 + fz_rand() % 4;
        memcpy(buf, s, len);
        for (k = 0; k < nmut; k++) {
            size_t pos = len ? fz_rand() % (len + 1) : 0;
            switch (fz_rand() % 5) {
            case 0: if (pos < len) buf[pos] = (unsigned char)fz_rand(); break;       /* replace a byte */
            case 1: if (pos < len) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break; /* delete */
            case 2: len = pos; break;                                                 /* truncate */
            default: {                                                                /* insert a token */
                const char *t = tokens[fz_rand() % nt];
                size_t tl = t[0] ? strlen(t) : 1;
                if (len + tl < (1 << 16)) {
                    memmove(buf + pos + tl, buf + pos, len - pos);
                    memcpy(buf + pos, t, tl);
                    len += tl;
                }
            }
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    free(buf);
    printf("fuzz_tune_json: %ld mutated inputs, no failure\n", iters);
    return 0;
}
#endif
