/* Autotune cache (qk_tune_cache_*): round trip, hand-written files, damaged and foreign files,
   16 processes storing at once, unwritable directories, path resolution, eviction.
   Inputs are fresh random keys each run (the seed is printed; QK_TEST_SEED=n repeats a run). */
#define _POSIX_C_SOURCE 200809L
#define QK_TUNE_CACHE_MAX_ENTRIES 1000   /* small enough to test eviction in a second */
#define QK_IMPLEMENTATION
#include "qk.h"

#include <dirent.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define QK_TEST_DETAIL() qk_last_error()
#include "../qk_test.h"

/* ---- helpers ---- */
static int rndi(int n) { return (int)(qk_test_rand64() % (uint64_t)n); }

typedef struct { int warns; char last[1024]; } logbook;
static void on_log(qk_log_level level, const char *msg, void *user) {
    logbook *lb = (logbook *)user;
    if (level == QK_LOG_WARN) lb->warns++;
    snprintf(lb->last, sizeof lb->last, "%s", msg);
}

static char g_dir[256];

static int count_substr(const char *s, const char *sub) {
    int n = 0;
    while ((s = strstr(s, sub)) != NULL) { n++; s += strlen(sub); }
    return n;
}

/* Files in a directory other than the cache and its lock (temporary files left behind). */
static int stray_files(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d) return -1;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, "autotune.json") ||
            !strcmp(de->d_name, "autotune.json.lock")) continue;
        fprintf(stderr, "stray file: %s/%s\n", dir, de->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* Random text for key strings: quotes, backslashes, control characters, multi-byte UTF-8. */
static void rnd_text(char *out, size_t cap) {
    static const char *const parts[] = {"NVIDIA", " ", "H200", "\"", "\\", "/", "\n", "\t", "\x01", "\x1f",
                                        "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x9a\x80", "{", "}", ",", ":", "x"};
    size_t n = 0, target = (size_t)rndi((int)cap - 8);
    out[0] = 0;
    while (n < target) {
        const char *p = parts[rndi((int)(sizeof parts / sizeof parts[0]))];
        size_t l = strlen(p);
        if (n + l >= cap) break;
        memcpy(out + n, p, l + 1);
        n += l;
    }
}

static double rnd_double(void) {
    for (;;) {
        uint64_t u = qk_test_rand64();
        double d;
        memcpy(&d, &u, sizeof d);
        if (d - d == 0.0) return d;  /* finite, including subnormals and -0 */
    }
}

static void rnd_entry(qk_tune_entry *e, int i) {
    static const char *const kernels[] = {"", "gram", "states", "gram_sym"};
    memset(e, 0, sizeof *e);
    rnd_text(e->key.device, 100);
    snprintf(e->key.device + strlen(e->key.device), 20, "#%d", i); /* distinct keys */
    e->key.cc_major = rndi(12);
    e->key.cc_minor = rndi(10);
    e->key.driver_version = (int)(qk_test_rand64() % 2000000000u) - (rndi(4) == 0 ? 1000000000 : 0);
    if (rndi(2)) snprintf(e->key.qk_version, sizeof e->key.qk_version, "%d.%d.%d", rndi(3), rndi(20), rndi(9));
    snprintf(e->key.kernel, sizeof e->key.kernel, "%s", kernels[rndi(4)]);
    e->key.path = (qk_path)(1 + rndi(3));
    e->key.precision = (qk_precision)rndi(QK_PRECISION_COUNT);
    e->key.n_qubits = 1 + rndi(rndi(2) ? 30 : QK_MAX_PRODUCT_QUBITS);
    rnd_text(e->config, 60);
    if (!e->config[0]) strcpy(e->config, "c");
    e->metric = rnd_double();
    e->timestamp = (int64_t)(qk_test_rand64() >> 1) * (rndi(2) ? 1 : -1);
    if (e->timestamp == 0) e->timestamp = 1;
}

/* What the cache returns for a stored key: "" fields given their defaults (written out here,
   not taken from qk.h's helper). */
static qk_tune_key expect_key(const qk_tune_key *k) {
    qk_tune_key r = *k;
    if (!r.qk_version[0]) strcpy(r.qk_version, "0.1.0");
    if (!r.kernel[0]) strcpy(r.kernel, "gram");
    return r;
}

static int same_entry(const qk_tune_entry *a, const qk_tune_entry *b) {
    return !strcmp(a->key.device, b->key.device) && a->key.cc_major == b->key.cc_major &&
           a->key.cc_minor == b->key.cc_minor && a->key.driver_version == b->key.driver_version &&
           !strcmp(a->key.qk_version, b->key.qk_version) && !strcmp(a->key.kernel, b->key.kernel) &&
           a->key.path == b->key.path && a->key.precision == b->key.precision &&
           a->key.n_qubits == b->key.n_qubits && !strcmp(a->config, b->config) &&
           memcmp(&a->metric, &b->metric, sizeof a->metric) == 0 && a->timestamp == b->timestamp;
}

static void mkpath(char *buf, size_t n, const char *sub) { snprintf(buf, n, "%s/%s", g_dir, sub); }

/* ---- path resolution ---- */
static void set_env(const char *name, const char *v) {
    if (v) setenv(name, v, 1); else unsetenv(name);
}

static void test_path(void) {
    static const char *const names[] = {"QK_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    char buf[256];
    int i;
    for (i = 0; i < 3; i++) { const char *v = getenv(names[i]); saved[i] = v ? strdup(v) : NULL; }

    set_env("QK_CACHE_DIR", NULL); set_env("XDG_CACHE_HOME", NULL); set_env("HOME", "/home/u");
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_OK && !strcmp(buf, "/home/u/.cache/qk/autotune.json"));
    set_env("XDG_CACHE_HOME", "relative/cache");  /* not absolute: ignored, as the XDG spec says */
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_OK && !strcmp(buf, "/home/u/.cache/qk/autotune.json"));
    set_env("XDG_CACHE_HOME", "/xdg/");
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_OK && !strcmp(buf, "/xdg/qk/autotune.json"));
    set_env("QK_CACHE_DIR", "");                  /* empty: unset */
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_OK && !strcmp(buf, "/xdg/qk/autotune.json"));
    set_env("QK_CACHE_DIR", "/q/c");
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_OK && !strcmp(buf, "/q/c/autotune.json"));
    CHECK(qk_tune_cache_path("", buf, sizeof buf) == QK_OK && !strcmp(buf, "/q/c/autotune.json"));
    CHECK(qk_tune_cache_path("rel/dir//", buf, sizeof buf) == QK_OK && !strcmp(buf, "rel/dir/autotune.json"));
    CHECK(qk_tune_cache_path("/", buf, sizeof buf) == QK_OK && !strcmp(buf, "/autotune.json"));
    /* the exact size works, one byte less is refused and leaves "" */
    CHECK(qk_tune_cache_path("/o", buf, strlen("/o/autotune.json") + 1) == QK_OK && !strcmp(buf, "/o/autotune.json"));
    CHECK(qk_tune_cache_path("/o", buf, strlen("/o/autotune.json")) == QK_ERROR_INVALID_ARGUMENT && buf[0] == 0);
    CHECK(qk_tune_cache_path("/o", NULL, 10) == QK_ERROR_INVALID_ARGUMENT);
    set_env("QK_CACHE_DIR", NULL); set_env("XDG_CACHE_HOME", NULL); set_env("HOME", NULL);
    CHECK(qk_tune_cache_path(NULL, buf, sizeof buf) == QK_ERROR_IO && buf[0] == 0);
    CHECK(qk_tune_cache_path("/still/works", buf, sizeof buf) == QK_OK);
    {   /* no directory at all: lookup and store warn and report IO, the caller goes on */
        logbook lb = {0, ""};
        qk_tune_entry e;
        rnd_entry(&e, 0);
        CHECK(qk_tune_cache_lookup(NULL, &e.key, &e, on_log, &lb) == QK_ERROR_IO && lb.warns == 1);
        CHECK(qk_tune_cache_store(NULL, &e, on_log, &lb) == QK_ERROR_IO && lb.warns == 2);
    }
    {   /* NULL path means the default path: exercised through HOME */
        logbook lb = {0, ""};
        qk_tune_entry e, got;
        char home[400], file[600];
        mkpath(home, sizeof home, "home");
        set_env("HOME", home);
        rnd_entry(&e, 1);
        CHECK(qk_tune_cache_store(NULL, &e, on_log, &lb) == QK_OK && lb.warns == 0);
        snprintf(file, sizeof file, "%s/.cache/qk/autotune.json", home);
        CHECK(access(file, R_OK) == 0);
        CHECK(qk_tune_cache_lookup(NULL, &e.key, &got, on_log, &lb) == QK_OK && lb.warns == 0);
        CHECK(qk_tune_cache_lookup(file, &e.key, &got, on_log, &lb) == QK_OK);
    }
    for (i = 0; i < 3; i++) { set_env(names[i], saved[i]); free(saved[i]); }
}

/* ---- round trip ---- */
#define N_RT 200
static void test_round_trip(void) {
    char path[600], dir[400];
    qk_tune_entry *e = (qk_tune_entry *)malloc(N_RT * sizeof *e), got, poison;
    logbook lb = {0, ""};
    int i, f;
    char *text;
    time_t t0, t1;
    mkpath(dir, sizeof dir, "rt/a/b");           /* missing: store creates it (mkdir -p) */
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    for (i = 0; i < N_RT; i++) rnd_entry(&e[i], i);

    memset(&poison, 0xA5, sizeof poison);
    got = poison;
    CHECK(qk_tune_cache_lookup(path, &e[0].key, &got, on_log, &lb) == QK_ERROR_IO);
    CHECK(lb.warns == 0);                        /* no file yet: a plain miss */
    CHECK(memcmp(&got, &poison, sizeof got) == 0);

    for (i = 0; i < N_RT; i++) CHECK(qk_tune_cache_store(path, &e[i], on_log, &lb) == QK_OK);
    CHECK(lb.warns == 0);
    for (i = 0; i < N_RT; i++) {
        qk_tune_entry want = e[i];
        want.key = expect_key(&e[i].key);
        memset(&got, 0, sizeof got);
        CHECK(qk_tune_cache_lookup(path, &e[i].key, &got, on_log, &lb) == QK_OK);
        CHECK(same_entry(&got, &want));
        /* the normalised key finds it too */
        CHECK(qk_tune_cache_lookup(path, &want.key, &got, on_log, &lb) == QK_OK && same_entry(&got, &want));
    }
    /* a key that differs in any one field misses (no warning, out untouched) */
    for (i = 0; i < 20; i++) {
        for (f = 0; f < 9; f++) {
            qk_tune_key k = expect_key(&e[i].key);
            switch (f) {
            case 0: k.device[0] = k.device[0] == 'Z' ? 'Y' : 'Z'; break;
            case 1: k.cc_major += 1; break;
            case 2: k.cc_minor += 1; break;
            case 3: k.driver_version ^= 1; break;
            case 4: strcpy(k.qk_version, "9.9.9"); break;
            case 5: strcpy(k.kernel, !strcmp(k.kernel, "other") ? "other2" : "other"); break;
            case 6: k.path = (qk_path)(1 + (int)k.path % 3); break;
            case 7: k.precision = (qk_precision)(((int)k.precision + 1) % QK_PRECISION_COUNT); break;
            default: k.n_qubits = k.n_qubits % QK_MAX_PRODUCT_QUBITS + 1; break;
            }
            got = poison;
            CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_ERROR_IO);
            CHECK(memcmp(&got, &poison, sizeof got) == 0);
        }
    }
    CHECK(lb.warns == 0);
    /* storing a key again replaces its entry: same count, new values */
    text = qk_test_read_file(path, NULL);
    CHECK(text && count_substr(text, "\"device\"") == N_RT);
    free(text);
    rnd_text(e[7].config, 60);
    strcat(e[7].config, "new");
    e[7].metric = rnd_double();
    e[7].timestamp = 0;                          /* 0: the store stamps it now */
    t0 = time(NULL);
    CHECK(qk_tune_cache_store(path, &e[7], on_log, &lb) == QK_OK);
    t1 = time(NULL);
    CHECK(qk_tune_cache_lookup(path, &e[7].key, &got, on_log, &lb) == QK_OK);
    CHECK(!strcmp(got.config, e[7].config) && memcmp(&got.metric, &e[7].metric, sizeof got.metric) == 0);
    CHECK(got.timestamp >= (int64_t)t0 && got.timestamp <= (int64_t)t1);
    text = qk_test_read_file(path, NULL);
    CHECK(text && count_substr(text, "\"device\"") == N_RT);
    CHECK(text && !strncmp(text, "{\n  \"schema\": 1,", 16));
    free(text);
    CHECK(stray_files(dir) == 0);
    CHECK(lb.warns == 0);

    /* qk_tune_key_init fills the same key as a hand-filled one */
    {
        qk_tune_key k;
        qk_tune_key_init(&k, "NVIDIA H200", 9, 0, 12080, NULL, QK_PATH_REAL, QK_PRECISION_FP32, 12);
        CHECK(!strcmp(k.device, "NVIDIA H200") && k.cc_major == 9 && k.cc_minor == 0 && k.driver_version == 12080 &&
              !strcmp(k.kernel, "gram") && !strcmp(k.qk_version, QK_VERSION_STRING) && k.path == QK_PATH_REAL &&
              k.precision == QK_PRECISION_FP32 && k.n_qubits == 12);
    }
    free(e);
}

/* ---- a file written by hand: key order, white space, escapes, unknown fields ---- */
static void test_hand_written(void) {
    char path[400];
    const char *text =
        "\r\n\t {\"entries\" :[ {\"timestamp\":-5,\"metric\":1.5e2 , \"config\":\"tm=\\u0031\\/2\",\n"
        "\"qubits\":12,\"precision\":\"fp64\",\"path\":\"real\",\"kernel\":\"states\",\"qk\":\"0.2.0\",\n"
        "\"driver\":12080,\"cc_minor\":0,\"cc_major\":9,\"device\":\"Caf\\u00e9 \\ud83d\\ude80 \\\"x\\\"\\\\\",\n"
        "\"future_field\": {\"a\": [1, 2.5e-3, true, false, null, {\"b\": \"\\n\"}]}},\n"
        "{\"device\":\"d\",\"cc_major\":8,\"cc_minor\":6,\"driver\":1,\"qk\":\"\",\"kernel\":\"\",\"path\":\"complex\","
        "\"precision\":\"default\",\"qubits\":4096,\"config\":\"c\",\"metric\":-0.0,\"timestamp\":9223372036854775807}],"
        " \"qk\": \"9.0\", \"other\": [], \"schema\" : 1 } \n";
    qk_tune_entry got;
    qk_tune_key k;
    logbook lb = {0, ""};
    mkpath(path, sizeof path, "hand.json");
    qk_test_write_text(path, text);
    memset(&k, 0, sizeof k);
    strcpy(k.device, "Caf\xc3\xa9 \xf0\x9f\x9a\x80 \"x\"\\");
    k.cc_major = 9; k.cc_minor = 0; k.driver_version = 12080;
    strcpy(k.qk_version, "0.2.0"); strcpy(k.kernel, "states");
    k.path = QK_PATH_REAL; k.precision = QK_PRECISION_FP64; k.n_qubits = 12;
    CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_OK);
    CHECK(!strcmp(got.config, "tm=1/2") && got.metric == 150.0 && got.timestamp == -5);
    memset(&k, 0, sizeof k);
    strcpy(k.device, "d");
    k.cc_major = 8; k.cc_minor = 6; k.driver_version = 1;   /* qk "" and kernel "" are defaults */
    k.path = QK_PATH_COMPLEX; k.precision = QK_PRECISION_DEFAULT; k.n_qubits = 4096;
    CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_OK);
    CHECK(!strcmp(got.config, "c") && got.metric == 0.0 && got.timestamp == INT64_MAX);
    CHECK(!strcmp(got.key.qk_version, "0.1.0") && !strcmp(got.key.kernel, "gram"));
    CHECK(lb.warns == 0);
}

/* ---- damaged, foreign and future files ---- */
static qk_tune_entry g_known;   /* an entry the damaged files are asked for */

/* Writes text at path; a lookup must be ignored with one warning naming the file (and containing
   expect_in_msg), a store must succeed with one warning and leave a file the cache reads. */
static void check_bad(const char *path, const char *text, size_t len, const char *expect_in_msg, int and_store) {
    logbook lb = {0, ""};
    qk_tune_entry got, poison;
    char *after;
    qk_test_write_file(path, text, len);
    memset(&poison, 0x5A, sizeof poison);
    got = poison;
    CHECK(qk_tune_cache_lookup(path, &g_known.key, &got, on_log, &lb) == QK_ERROR_FORMAT);
    CHECK(lb.warns == 1 && strstr(lb.last, path) != NULL);
    CHECK(memcmp(&got, &poison, sizeof got) == 0);
    if (expect_in_msg && !strstr(lb.last, expect_in_msg)) {
        qk_test_fails++;
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", lb.last, expect_in_msg);
    }
    if (!and_store) return;
    CHECK(qk_tune_cache_store(path, &g_known, on_log, &lb) == QK_OK);
    CHECK(lb.warns == 2 && strstr(lb.last, "rewriting") != NULL);
    CHECK(qk_tune_cache_lookup(path, &g_known.key, &got, on_log, &lb) == QK_OK && lb.warns == 2);
    after = qk_test_read_file(path, NULL);
    CHECK(after && count_substr(after, "\"device\"") == 1 && !strncmp(after, "{\n  \"schema\": 1,", 16));
    free(after);
}

static void test_bad_files(void) {
    static const char *const corrupt[] = {
        "", "   \n", "garbage", "{", "{\"schema\": 1, \"entries\": [", "{\"schema\": 1, \"entries\": []",
        "{\"schema\": 1, \"entries\": [],}", "{\"schema\": 1, \"entries\": [1,]}", "{\"schema\": 1 \"entries\": []}",
        "{'schema': 1, 'entries': []}", "{\"schema\": 1, \"entries\": []} x", "{\"schema\": 1, \"entries\": []}{}",
        "// c\n{\"schema\": 1, \"entries\": []}", "{\"schema\": 01, \"entries\": []}", "{\"schema\": 1., \"entries\": []}",
        "{\"schema\": NaN, \"entries\": []}", "{\"schema\": 1, \"entries\": [], \"x\": \"\x01\"}",
        "\xEF\xBB\xBF{\"schema\": 1, \"entries\": []}", "{\"schema\": 1, \"entries\": [], \"x\": \"\xC0\xAF\"}",
        "{\"schema\": 1, \"entries\": [], \"x\": \"\xED\xA0\x80\"}", "{\"schema\": 1, \"entries\": [], \"x\": \"\\ud800\"}",
        "{\"schema\": 1, \"entries\": [], \"x\": \"\\udc00\"}", "{\"schema\": 1, \"entries\": [], \"x\": \"\\q\"}",
        "{\"schema\": 1, \"entries\": [], \"x\": \"\\u12G4\"}", "{\"schema\": 1, \"entries\": [], \"x\": tru}",
        "{\"schema\": 1, \"entries\": [], \"x\": 1e}", "{\"schema\": 1, \"entries\": [], \"x\": -}",
        "{\"schema\": 1, \"entries\": [], \"x\": 123456789012345678901234567890123456789012345}",
        /* schema 1 but entries that break it */
        "{\"schema\": 1, \"entries\": [{}]}", "{\"schema\": 1, \"entries\": [7]}", "{\"schema\": 1, \"entries\": {}}",
        "{\"schema\": 1, \"entries\": [], \"entries\": []}", "{\"schema\": 1, \"qk\": 3, \"entries\": []}",
    };
    static const char *const entry_fmt =
        "{\"schema\": 1, \"entries\": [{\"device\": \"d\", \"cc_major\": 9, \"cc_minor\": 0, \"driver\": 1, \"qk\": \"0.1.0\", "
        "\"kernel\": \"gram\", \"path\": %s, \"precision\": \"fp32\", \"qubits\": %s, \"config\": %s, \"metric\": %s, "
        "\"timestamp\": %s%s}]}";
    static const char *const bad_fields[][6] = {  /* path, qubits, config, metric, timestamp, extra */
        {"\"quantum\"", "4", "\"c\"", "1", "1", ""}, {"\"real\"", "0", "\"c\"", "1", "1", ""},
        {"\"real\"", "4097", "\"c\"", "1", "1", ""}, {"\"real\"", "2.5", "\"c\"", "1", "1", ""},
        {"\"real\"", "4", "\"\"", "1", "1", ""}, {"\"real\"", "4", "\"c\"", "1e999", "1", ""},
        {"\"real\"", "4", "\"c\"", "\"fast\"", "1", ""}, {"\"real\"", "4", "\"c\"", "1", "1.5", ""},
        {"\"real\"", "4", "\"c\"", "1", "9223372036854775808", ""}, {"\"real\"", "4", "\"c\"", "1", "1", ", \"qubits\": 4"},
        {"\"real\"", "4", "\"c\\u0000d\"", "1", "1", ""}, {"4", "4", "\"c\"", "1", "1", ""},
        {"\"real\"", "4", "\"0123456789012345678901234567890123456789012345678901234567890123\"", "1", "1", ""},
        {"\"real\"", "4", "\"c\"", "1", "1", ", \"device\": \"again\""},
    };
    static const char *const foreign[] = {"[1, 2, 3]", "\"autotune\"", "42", "null", "{}",
                                          "{\"name\": \"other tool\", \"version\": 3}", "{\"schema\": \"1\", \"entries\": []}",
                                          "{\"schema\": 1.5, \"entries\": []}", "{\"schema\": 1}"};
    static const char *const older[] = {"{\"schema\": 0, \"entries\": []}", "{\"schema\": -1, \"entries\": []}"};
    static const char *const future[] = {"{\"schema\": 2, \"entries\": [{\"anything\": [true]}]}",
                                         "{\"entries\": \"v2 layout\", \"schema\": 99999999999}"};
    char path[400], text[1024], *valid;
    size_t i, len;
    int n_prefix = 0;
    mkpath(path, sizeof path, "bad/autotune.json");
    rnd_entry(&g_known, 12345);
    {   /* create the directory */
        logbook lb = {0, ""};
        CHECK(qk_tune_cache_store(path, &g_known, on_log, &lb) == QK_OK && lb.warns == 0);
    }
    for (i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) check_bad(path, corrupt[i], strlen(corrupt[i]), "corrupt", 1);
    for (i = 0; i < sizeof bad_fields / sizeof bad_fields[0]; i++) {
        snprintf(text, sizeof text, entry_fmt, bad_fields[i][0], bad_fields[i][1], bad_fields[i][2], bad_fields[i][3],
                 bad_fields[i][4], bad_fields[i][5]);
        check_bad(path, text, strlen(text), "corrupt", 1);
    }
    snprintf(text, sizeof text, entry_fmt, "\"real\"", "4", "\"c\"", "1", "1", "");  /* the control: fine */
    qk_test_write_text(path, text);
    {
        logbook lb = {0, ""};
        qk_tune_entry got;
        CHECK(qk_tune_cache_lookup(path, &g_known.key, &got, on_log, &lb) == QK_ERROR_IO && lb.warns == 0);
    }
    for (i = 0; i < sizeof foreign / sizeof foreign[0]; i++) check_bad(path, foreign[i], strlen(foreign[i]), "not a qk autotune cache", 1);
    for (i = 0; i < sizeof older / sizeof older[0]; i++) check_bad(path, older[i], strlen(older[i]), "unknown schema", 1);
    for (i = 0; i < sizeof future / sizeof future[0]; i++) check_bad(path, future[i], strlen(future[i]), "newer qk", 1);
    /* a NUL byte, and nesting far deeper than the reader goes */
    check_bad(path, "{\"schema\": 1,\0 \"entries\": []}", 29, "corrupt", 1);
    {
        size_t depth = 200000;
        char *deep = (char *)malloc(2 * depth + 64);
        if (!deep) exit(1);
        len = (size_t)sprintf(deep, "{\"schema\": 1, \"entries\": [], \"x\": ");
        memset(deep + len, '[', depth);
        memset(deep + len + depth, ']', depth);
        strcpy(deep + len + 2 * depth, "}");
        check_bad(path, deep, strlen(deep), "nested too deeply", 1);
        free(deep);
    }
    {   /* larger than QK_TUNE_CACHE_MAX_BYTES (valid JSON all the same) */
        size_t big = (size_t)QK_TUNE_CACHE_MAX_BYTES + 10;
        char *huge = (char *)malloc(big + 64);
        if (!huge) exit(1);
        memset(huge, ' ', big);
        strcpy(huge + big, "{\"schema\": 1, \"entries\": []}");
        check_bad(path, huge, strlen(huge), "larger than", 1);
        free(huge);
    }
    /* every truncation of a real file (3 entries) is ignored; the file itself is fine */
    {
        logbook lb = {0, ""};
        qk_tune_entry e;
        int k;
        for (k = 0; k < 3; k++) { rnd_entry(&e, 500 + k); CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK); }
        valid = qk_test_read_file(path, &len);
        CHECK(valid && len > 100);
        for (i = 0; valid && i + 2 <= len; i++) {  /* the last byte is '\n': dropping it leaves a whole file */
            check_bad(path, valid, i, NULL, i % 97 == 0);
            n_prefix++;
        }
        free(valid);
    }
    printf("  bad files: %d truncations and %d other damaged, foreign or future files\n", n_prefix,
           (int)(sizeof corrupt / sizeof corrupt[0] + sizeof bad_fields / sizeof bad_fields[0] +
                 sizeof foreign / sizeof foreign[0] + sizeof older / sizeof older[0] + sizeof future / sizeof future[0] + 3));
    /* a directory where the file should be: a warning, never a crash */
    {
        logbook lb = {0, ""};
        qk_tune_entry got;
        mkpath(path, sizeof path, "bad/isdir");
        mkdir(path, 0777);
        CHECK(qk_tune_cache_lookup(path, &g_known.key, &got, on_log, &lb) == QK_ERROR_IO && lb.warns == 1);
        CHECK(qk_tune_cache_store(path, &g_known, on_log, &lb) == QK_ERROR_IO && lb.warns >= 2);
        CHECK(stray_files(path) == 0);
    }
}

/* ---- 16 processes at once ---- */
#define N_PROC 16
#define N_KEYS 24
#define N_ROUNDS 3
static void proc_entry(qk_tune_entry *e, int p, int k, int round) {
    memset(e, 0, sizeof *e);
    snprintf(e->key.device, sizeof e->key.device, "proc \"%d\"", p);
    e->key.cc_major = 9;
    e->key.driver_version = 12080;
    e->key.path = (qk_path)(1 + k % 3);
    e->key.precision = QK_PRECISION_FP32;
    e->key.n_qubits = 1 + k;
    snprintf(e->config, sizeof e->config, "p%d-k%d-r%d", p, k, round);
    e->metric = p + k / 100.0 + round / 10000.0;
    e->timestamp = 1000000 + round;
}

static void test_concurrent(void) {
    char dir[400], path[600], stop[600];
    pid_t pids[N_PROC + 1];
    int p, k, status, ok_procs = 0, reads = 0;
    double t0 = (double)clock();
    struct timespec w0, w1;
    mkpath(dir, sizeof dir, "conc");
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    snprintf(stop, sizeof stop, "%s.stop", g_dir);
    (void)t0;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    for (p = 0; p <= N_PROC; p++) {
        pids[p] = fork();
        if (pids[p] < 0) { perror("fork"); exit(1); }
        if (pids[p] == 0) {
            logbook lb = {0, ""};
            int bad = 0, r;
            if (p == N_PROC) {
                /* the reader: the file always parses (or does not exist yet) while they write */
                qk_tune_entry got, e;
                int n = 0;
                proc_entry(&e, 0, 0, 0);
                while (access(stop, F_OK) != 0) {
                    qk_result q = qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb);
                    if (q == QK_ERROR_FORMAT) bad++;
                    n++;
                }
                _exit(bad || lb.warns || n == 0 ? 1 : 0);
            }
            for (r = 0; r < N_ROUNDS; r++)
                for (k = 0; k < N_KEYS; k++) {
                    qk_tune_entry e;
                    proc_entry(&e, p, (k + p) % N_KEYS, r);   /* different orders per process */
                    if (qk_tune_cache_store(path, &e, on_log, &lb) != QK_OK) bad++;
                }
            _exit(bad || lb.warns ? 1 : 0);
        }
    }
    for (p = 0; p < N_PROC; p++) {
        CHECK(waitpid(pids[p], &status, 0) == pids[p]);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok_procs++;
        else fprintf(stderr, "writer %d failed (status %d)\n", p, status);
    }
    qk_test_write_file(stop, "", 0);
    CHECK(waitpid(pids[N_PROC], &status, 0) == pids[N_PROC]);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    reads++;
    unlink(stop);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    CHECK(ok_procs == N_PROC);
    {
        logbook lb = {0, ""};
        int found = 0;
        char *text = qk_test_read_file(path, NULL);
        for (p = 0; p < N_PROC; p++)
            for (k = 0; k < N_KEYS; k++) {
                qk_tune_entry want, got;
                proc_entry(&want, p, k, N_ROUNDS - 1);
                want.key = expect_key(&want.key);
                if (qk_tune_cache_lookup(path, &want.key, &got, on_log, &lb) == QK_OK && same_entry(&got, &want)) found++;
            }
        CHECK(found == N_PROC * N_KEYS);
        CHECK(text && count_substr(text, "\"device\"") == N_PROC * N_KEYS);
        CHECK(lb.warns == 0);
        CHECK(stray_files(dir) == 0);
        printf("  concurrent: %d processes x %d stores, %d of %d keys found, %.2f s\n", N_PROC, N_KEYS * N_ROUNDS,
               found, N_PROC * N_KEYS,
               (double)(w1.tv_sec - w0.tv_sec) + 1e-9 * (double)(w1.tv_nsec - w0.tv_nsec));
        free(text);
    }
}

/* ---- unwritable places ---- */
static void test_unwritable(void) {
    char file[400], path[600];
    qk_tune_entry e, got;
    logbook lb = {0, ""};
    struct stat st;
    rnd_entry(&e, 77);
    /* A path below a regular file: mkdir fails with ENOTDIR, for root too. */
    mkpath(file, sizeof file, "plain-file");
    qk_test_write_file(file, "x", 1);
    snprintf(path, sizeof path, "%s/sub/dir/autotune.json", file);
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_ERROR_IO);
    CHECK(lb.warns == 1 && strstr(lb.last, "cannot create directory") && strstr(lb.last, "no cache"));
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_ERROR_IO);
    snprintf(path, sizeof path, "%s/autotune.json", file);
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_ERROR_IO && lb.warns == 3);
    CHECK(stat(file, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 1);
    CHECK(qk_tune_cache_store(path, &e, NULL, NULL) == QK_ERROR_IO);   /* no callback: silent */
    /* A read-only directory (root ignores permissions: checked only for other users). */
    if (geteuid() != 0) {
        char dir[400];
        mkpath(dir, sizeof dir, "ro");
        snprintf(path, sizeof path, "%s/autotune.json", dir);
        CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK);
        CHECK(chmod(dir, 0555) == 0);
        lb.warns = 0;
        {
            qk_tune_entry e2;
            rnd_entry(&e2, 78);
            CHECK(qk_tune_cache_store(path, &e2, on_log, &lb) == QK_ERROR_IO && lb.warns == 1);
            CHECK(qk_tune_cache_lookup(path, &e2.key, &got, on_log, &lb) == QK_ERROR_IO);
        }
        CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_OK);  /* reading still works */
        CHECK(stray_files(dir) == 0);
        chmod(dir, 0755);
    } else {
        printf("  read-only directory: skipped (running as root, which ignores permissions); ENOTDIR checked\n");
    }
}

/* ---- invalid arguments ---- */
static void test_args(void) {
    char path[400];
    qk_tune_entry e, bad, got;
    logbook lb = {0, ""};
    char *before, *after;
    mkpath(path, sizeof path, "args/autotune.json");
    rnd_entry(&e, 5);
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK);
    before = qk_test_read_file(path, NULL);
    CHECK(qk_tune_cache_lookup(path, NULL, &got, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(qk_tune_cache_lookup(path, &e.key, NULL, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(qk_tune_cache_store(path, NULL, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.key.path = (qk_path)0;  CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(qk_tune_cache_lookup(path, &bad.key, &got, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.key.path = (qk_path)4;  CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.key.precision = (qk_precision)QK_PRECISION_COUNT; CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.key.n_qubits = 0; CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.key.n_qubits = QK_MAX_PRODUCT_QUBITS + 1; CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; memset(bad.key.device, 'a', sizeof bad.key.device); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; memset(bad.key.kernel, 'a', sizeof bad.key.kernel); CHECK(qk_tune_cache_lookup(path, &bad.key, &got, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; memset(bad.key.qk_version, 'a', sizeof bad.key.qk_version); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.config[0] = 0; CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; memset(bad.config, 'c', sizeof bad.config); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.metric = strtod("nan", NULL); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.metric = strtod("inf", NULL); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    bad = e; bad.metric = -strtod("inf", NULL); CHECK(qk_tune_cache_store(path, &bad, on_log, &lb) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(qk_last_error(), "metric") != NULL);
    after = qk_test_read_file(path, NULL);
    CHECK(before && after && !strcmp(before, after));
    CHECK(lb.warns == 0);
    free(before);
    free(after);
}

/* ---- eviction beyond QK_TUNE_CACHE_MAX_ENTRIES (1000 in this test) ---- */
static void test_eviction(void) {
    char path[400], *text;
    int n = QK_TUNE_CACHE_MAX_ENTRIES, i, oldest = 0, second = 0;
    int64_t *ts = (int64_t *)malloc((size_t)n * sizeof *ts);
    size_t cap = (size_t)n * 400 + 100, len = 0;
    logbook lb = {0, ""};
    qk_tune_entry e, got;
    qk_tune_key k;
    mkpath(path, sizeof path, "evict.json");
    /* written here with printf, not by the cache, with distinct random timestamps */
    text = (char *)malloc(cap);
    len += (size_t)sprintf(text + len, "{\"schema\": 1, \"entries\": [");
    for (i = 0; i < n; i++) {
        ts[i] = 1000 + (int64_t)i * 1000 + rndi(1000);
        if (i > 0) { int j = rndi(i + 1); int64_t t = ts[i]; ts[i] = ts[j]; ts[j] = t; }
    }
    for (i = 0; i < n; i++) {
        len += (size_t)sprintf(text + len, "%s{\"device\": \"dev%d\", \"cc_major\": 9, \"cc_minor\": 0, \"driver\": 1, "
                               "\"qk\": \"0.1.0\", \"kernel\": \"gram\", \"path\": \"real\", \"precision\": \"fp32\", "
                               "\"qubits\": 8, \"config\": \"cfg%d\", \"metric\": %d, \"timestamp\": %lld}",
                               i ? ",\n" : "", i, i, i, (long long)ts[i]);
        if (ts[i] < ts[oldest]) oldest = i;
    }
    second = oldest == 0 ? 1 : 0;
    for (i = 0; i < n; i++) if (i != oldest && ts[i] < ts[second]) second = i;
    len += (size_t)sprintf(text + len, "]}");
    qk_test_write_file(path, text, len);
    free(text);
    memset(&k, 0, sizeof k);
    k.cc_major = 9; k.driver_version = 1; k.path = QK_PATH_REAL; k.precision = QK_PRECISION_FP32; k.n_qubits = 8;
    snprintf(k.device, sizeof k.device, "dev%d", oldest);
    CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_OK);
    /* a new entry, older than all: kept; the oldest other one goes */
    memset(&e, 0, sizeof e);
    e.key = k;
    strcpy(e.key.device, "newcomer");
    strcpy(e.config, "new");
    e.timestamp = 1;
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK);
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_OK && !strcmp(got.config, "new"));
    CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_ERROR_IO);
    snprintf(k.device, sizeof k.device, "dev%d", second);
    CHECK(qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_OK && got.timestamp == ts[second]);
    for (i = 0; i < 50; i++) {
        int j = rndi(n);
        snprintf(k.device, sizeof k.device, "dev%d", j);
        CHECK((qk_tune_cache_lookup(path, &k, &got, on_log, &lb) == QK_OK) == (j != oldest));
    }
    text = qk_test_read_file(path, NULL);
    CHECK(text && count_substr(text, "\"device\"") == n);
    free(text);
    CHECK(lb.warns == 0);
    free(ts);
}

/* ---- a locale whose decimal point is ',' (where one is installed) ---- */
static void test_locale(void) {
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "de_DE", "ru_RU.UTF-8"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (setlocale(LC_NUMERIC, names[i]) && localeconv()->decimal_point[0] != '.') break;
    if (i == sizeof names / sizeof names[0]) {
        setlocale(LC_NUMERIC, "C");
        printf("  locale: skipped (no locale with a ',' decimal point installed)\n");
        return;
    }
    {
        char path[400], *text;
        qk_tune_entry e, got;
        logbook lb = {0, ""};
        mkpath(path, sizeof path, "locale.json");
        rnd_entry(&e, 9);
        e.metric = 1.25;
        CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK);
        CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_OK && got.metric == 1.25);
        text = qk_test_read_file(path, NULL);
        CHECK(text && strstr(text, "\"metric\": 1.25,"));
        free(text);
        CHECK(lb.warns == 0);
        printf("  locale: %s checked\n", names[i]);
    }
    setlocale(LC_NUMERIC, "C");
}

/* ---- the policy: qk_tune_choose with a fake tuner ---- */
typedef struct { int calls; int fail; int bad_metric; } fake_tuner;
static qk_result fake_measure(const qk_tune_key *key, char *config, size_t size, double *metric, void *user) {
    fake_tuner *ft = (fake_tuner *)user;
    ft->calls++;
    if (ft->fail) return QK_ERROR_CUDA;
    snprintf(config, size, "m%d-q%d", ft->calls, key->n_qubits);
    *metric = ft->bad_metric ? strtod("inf", NULL) : 10.0 + ft->calls;
    return QK_OK;
}

static void test_choose(void) {
    qk_tune_request rq;
    fake_tuner ft = {0, 0, 0};
    logbook lb = {0, ""};
    char dir[400], path[600], cfg[64], label[64], want[64];
    qk_tune_entry got;
    memset(&rq, 0, sizeof rq);
    mkpath(dir, sizeof dir, "choose/cache");
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    qk_tune_key_init(&rq.key, "GPU X", 9, 0, 12080, NULL, QK_PATH_REAL, QK_PRECISION_FP32, 10);
    rq.cache_dir = dir;
    rq.fixed_config = "tm=64,tn=64";
    rq.measure = fake_measure;
    rq.measure_user = &ft;
    rq.log = on_log;
    rq.log_user = &lb;
    /* off: the table, no tuning, no file */
    rq.mode = -1;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "tm=64,tn=64") && !strcmp(label, "fixed (autotune off): tm=64,tn=64") && ft.calls == 0);
    CHECK(access(path, F_OK) != 0);
    /* default: measured once and stored, then from the cache */
    rq.mode = 0;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "m1-q10") && !strcmp(label, "tuned (measured): m1-q10") && ft.calls == 1);
    CHECK(qk_tune_cache_lookup(path, &rq.key, &got, on_log, &lb) == QK_OK && !strcmp(got.config, "m1-q10") && got.metric == 11.0);
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "m1-q10") && !strcmp(label, "tuned (cache): m1-q10") && ft.calls == 1);
    /* a different key misses and is measured */
    rq.key.n_qubits = 11;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, NULL, 0) == QK_OK && !strcmp(cfg, "m2-q11") && ft.calls == 2);
    rq.key.n_qubits = 10;
    /* force: measured again although cached, and the cache updated */
    rq.mode = 1;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "m3-q10") && !strcmp(label, "tuned (measured): m3-q10") && ft.calls == 3);
    CHECK(qk_tune_cache_lookup(path, &rq.key, &got, on_log, &lb) == QK_OK && !strcmp(got.config, "m3-q10"));
    CHECK(lb.warns == 0);
    /* the tuner fails or returns nonsense: the table, a warning, the cache unchanged */
    ft.fail = 1;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "tm=64,tn=64") && !strcmp(label, "fixed (autotune failed): tm=64,tn=64") && lb.warns == 1);
    ft.fail = 0;
    ft.bad_metric = 1;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "tm=64,tn=64") && lb.warns == 2);
    ft.bad_metric = 0;
    CHECK(qk_tune_cache_lookup(path, &rq.key, &got, on_log, &lb) == QK_OK && !strcmp(got.config, "m3-q10"));
    /* no tuner in this build */
    rq.mode = 0;
    rq.measure = NULL;
    rq.key.n_qubits = 12;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    CHECK(!strcmp(cfg, "tm=64,tn=64") && !strcmp(label, "fixed (no tuner): tm=64,tn=64") && lb.warns == 2);
    rq.measure = fake_measure;
    /* an unwritable cache: measured, used, a warning; never a failure */
    snprintf(dir, sizeof dir, "%s/plain-file/cache", g_dir);
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK);
    snprintf(want, sizeof want, "m%d-q12", ft.calls);
    CHECK(!strcmp(cfg, want) && !strncmp(label, "tuned (measured): ", 18) && lb.warns >= 3);
    /* a corrupt cache: measured and rewritten */
    rq.cache_dir = "";  /* the default: QK_CACHE_DIR */
    mkpath(dir, sizeof dir, "choose/env");
    setenv("QK_CACHE_DIR", dir, 1);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    qk_test_write_file(path, "{\"schema\": 1, \"entries\": [", 25);
    lb.warns = 0;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK && !strncmp(label, "tuned (measured): ", 18));
    CHECK(lb.warns == 2);  /* the lookup and the store each say they ignore the file */
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_OK && !strncmp(label, "tuned (cache): ", 15));
    /* a short label buffer keeps the source (QK_CACHE_DIR still set: the test never touches the
       user's own cache, which may hold anything) */
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, 16) == QK_OK && !strcmp(label, "tuned (cache): "));
    unsetenv("QK_CACHE_DIR");
    /* bad arguments */
    CHECK(qk_tune_choose(NULL, cfg, sizeof cfg, label, sizeof label) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(qk_tune_choose(&rq, NULL, sizeof cfg, label, sizeof label) == QK_ERROR_INVALID_ARGUMENT);
    CHECK(qk_tune_choose(&rq, cfg, 0, label, sizeof label) == QK_ERROR_INVALID_ARGUMENT);
    rq.fixed_config = NULL;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_ERROR_INVALID_ARGUMENT);
    rq.fixed_config = "x";
    rq.key.n_qubits = 0;
    CHECK(qk_tune_choose(&rq, cfg, sizeof cfg, label, sizeof label) == QK_ERROR_INVALID_ARGUMENT);
}

/* ---- special files at the cache's paths (issue 27, item 2) ---- */
static int same_stored(const qk_tune_entry *got, const qk_tune_entry *stored) {
    qk_tune_entry want = *stored;
    want.key = expect_key(&stored->key);
    return same_entry(got, &want);
}

/* Runs body in a child process under a watchdog: a call that blocks (a FIFO opened for reading
   waits for a writer forever) fails the test after 20 s instead of hanging it. */
static void watched(const char *what, void (*body)(void)) {
    pid_t pid;
    int status = 0, waited;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) { perror("fork"); qk_test_fails++; return; }
    if (pid == 0) {
        qk_test_fails = 0;
        alarm(60);  /* the child never outlives a lost parent for long */
        body();
        fflush(stdout);
        _exit(qk_test_fails ? 1 : 0);
    }
    for (waited = 0; waited < 2000; waited++) {   /* 20 s in 10 ms steps */
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0) { perror("waitpid"); break; }
        { struct timespec ts = {0, 10000000}; nanosleep(&ts, NULL); }
    }
    qk_test_checks++;
    if (waited == 2000) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        printf("FAIL %s: hung (killed after 20 s)\n", what);
        qk_test_fails++;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAIL %s: failed checks in the child (status %d)\n", what, status);
        qk_test_fails++;
    }
}

static void fifo_at_cache(void) {
    char dir[400], path[600];
    logbook lb = {0, ""};
    qk_tune_entry e, got;
    struct stat st;
    rnd_entry(&e, 91);
    mkpath(dir, sizeof dir, "special/fifo");
    CHECK(qk__tune_mkdirs(dir) == 0);
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    CHECK(mkfifo(path, 0666) == 0);
    /* lookup: ignored with a warning naming the file and what it is, nothing changed */
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_ERROR_FORMAT);
    CHECK(lb.warns == 1 && strstr(lb.last, path) && strstr(lb.last, "FIFO"), "%s", lb.last);
    CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode));
    /* store: ignored as a corrupt file is, replaced by the new file */
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK);
    CHECK(lb.warns == 2 && strstr(lb.last, "FIFO") && strstr(lb.last, "rewriting"), "%s", lb.last);
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_OK && same_stored(&got, &e) && lb.warns == 2);
    CHECK(stray_files(dir) == 0);
}

static void fifo_at_lock(void) {
    char dir[400], path[600], lockp[620];
    logbook lb = {0, ""};
    qk_tune_entry e, got;
    struct stat st;
    rnd_entry(&e, 92);
    mkpath(dir, sizeof dir, "special/lockfifo");
    CHECK(qk__tune_mkdirs(dir) == 0);
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    CHECK(mkfifo(lockp, 0666) == 0);
    /* store: no lock to take, so no store; a warning naming the lock and what it is */
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_ERROR_IO);
    CHECK(lb.warns == 1 && strstr(lb.last, lockp) && strstr(lb.last, "FIFO") && strstr(lb.last, "no cache"),
          "%s", lb.last);
    CHECK(lstat(lockp, &st) == 0 && S_ISFIFO(st.st_mode) && lstat(path, &st) != 0);
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_ERROR_IO && lb.warns == 1);  /* a miss */
}

static void symlinks_at_lock_and_tmp(void) {
    char dir[400], path[600], lockp[620], tmp[660], victim[620], target[620];
    logbook lb = {0, ""};
    qk_tune_entry e, got;
    struct stat st;
    char *v;
    rnd_entry(&e, 93);
    mkpath(dir, sizeof dir, "special/links");
    CHECK(qk__tune_mkdirs(dir) == 0);
    snprintf(path, sizeof path, "%s/autotune.json", dir);
    snprintf(lockp, sizeof lockp, "%s.lock", path);
    /* a symbolic link at the lock: O_CREAT would create its target; refused, nothing created */
    snprintf(target, sizeof target, "%s/created-through-link", dir);
    CHECK(symlink(target, lockp) == 0);
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_ERROR_IO);
    CHECK(lb.warns == 1 && strstr(lb.last, lockp) && strstr(lb.last, "symbolic link"), "%s", lb.last);
    CHECK(lstat(target, &st) != 0);
    CHECK(unlink(lockp) == 0);
    /* a symbolic link at this process's first temporary name: skipped (O_EXCL), never followed */
    snprintf(victim, sizeof victim, "%s/victim", dir);
    qk_test_write_file(victim, "DATA\n", 5);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.0", path, (long)getpid());
    CHECK(symlink(victim, tmp) == 0);
    lb.warns = 0;
    CHECK(qk_tune_cache_store(path, &e, on_log, &lb) == QK_OK && lb.warns == 0);
    v = qk_test_read_file(victim, NULL);
    CHECK(v && !strcmp(v, "DATA\n"));
    free(v);
    CHECK(qk_tune_cache_lookup(path, &e.key, &got, on_log, &lb) == QK_OK && same_stored(&got, &e));
    CHECK(lstat(tmp, &st) == 0 && S_ISLNK(st.st_mode));
}

static void test_special_files(void) {
    watched("a FIFO at the cache path", fifo_at_cache);
    watched("a FIFO at the lock path", fifo_at_lock);
    watched("symbolic links at the lock and temporary paths", symlinks_at_lock_and_tmp);
}

int main(void) {
    char cmd[300];
    qk_test_seed();
    snprintf(g_dir, sizeof g_dir, "%s/qk-tune-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    fflush(stdout);
    test_path();
    test_round_trip();
    test_hand_written();
    test_bad_files();
    test_concurrent();
    test_unwritable();
    test_args();
    test_eviction();
    test_locale();
    test_choose();
    test_special_files();
    if (!qk_test_fails) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    } else {
        fprintf(stderr, "files kept in %s\n", g_dir);
    }
    printf("test_tune_cache: %s (%d failed checks)\n", qk_test_fails ? "FAIL" : "ok", qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
