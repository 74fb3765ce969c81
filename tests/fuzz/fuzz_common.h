/* Shared by the input fuzz targets (tests/fuzz/fuzz_map_parse.c, fuzz_npy_read.c, fuzz_csv_read.c,
   fuzz_weights.c, fuzz_qk_gram_args.c). A target defines

     int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
     static size_t fz_seed(int i, unsigned char *buf, size_t cap);   seed i into buf, 0 past the last
     static const char *fz_token(int i);                             token i the mutator inserts,
                                                                     NULL past the last ("" stands
                                                                     for one NUL byte)
   after including this file (first), which gives

     FZ_CHECK(c)              the oracle's assertion: prints the line and aborts
     fz_path(ext)             a per-process scratch file name (in /dev/shm when it exists)
     fz_write(path, d, n)     writes the input there
     fz_printable(s)          1 when s holds printable ASCII only (messages quote files escaped)

   and, built with -DQK_FUZZ_STANDALONE (any compiler; the meson *_smoke tests), a main that runs
   the seeds and a fixed count of random mutations of them (bytes replaced, deleted, inserted,
   tokens inserted, truncation, splices of two seeds): `target N` runs N inputs; `target
   --write-seeds DIR` writes the seeds as files for a libFuzzer corpus (docs/api.md "Fuzzing"). */
#ifndef QK_FUZZ_COMMON_H
#define QK_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GNUC__) || defined(__clang__)
#define FZ_UNUSED __attribute__((unused))
#else
#define FZ_UNUSED
#endif

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
static size_t fz_seed(int i, unsigned char *buf, size_t cap);
static const char *fz_token(int i);

#define FZ_CHECK(c)                                                                  \
    do {                                                                             \
        if (!(c)) {                                                                  \
            fprintf(stderr, "%s:%d: oracle failed: %s\n", __FILE__, __LINE__, #c);   \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* Scratch files (one per extension), removed at exit. */
static char fz_paths[4][300], fz_exts[4][16];
static void fz_cleanup(void) {
    int i;
    for (i = 0; i < 4; i++)
        if (fz_paths[i][0]) remove(fz_paths[i]);
}
FZ_UNUSED static const char *fz_path(const char *ext) {
    int i;
    for (i = 0; i < 4 && fz_paths[i][0]; i++)
        if (strcmp(fz_exts[i], ext) == 0) return fz_paths[i];
    if (i == 4) i = 3;
    {
        const char *t = getenv("TMPDIR");
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : t && *t ? t : "/tmp";
        if (!fz_paths[0][0]) atexit(fz_cleanup);
        snprintf(fz_paths[i], sizeof fz_paths[i], "%s/qk-fuzz-%ld%s", dir, (long)getpid(), ext);
        snprintf(fz_exts[i], sizeof fz_exts[i], "%s", ext);
    }
    return fz_paths[i];
}

FZ_UNUSED static void fz_write(const char *path, const unsigned char *d, size_t n) {
    FILE *f = fopen(path, "wb");
    FZ_CHECK(f != NULL);
    if (n) FZ_CHECK(fwrite(d, 1, n, f) == n);
    FZ_CHECK(fclose(f) == 0);
}

FZ_UNUSED static int fz_printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) return 0;
    return 1;
}

#ifdef QK_FUZZ_STANDALONE
static unsigned long long fz_rng = 88172645463325252ull;
static unsigned fz_rand(void) { fz_rng ^= fz_rng << 13; fz_rng ^= fz_rng >> 7; fz_rng ^= fz_rng << 17; return (unsigned)(fz_rng >> 11); }

enum { FZ_CAP = 1 << 16 };

int main(int argc, char **argv) {
    static unsigned char seeds[64][FZ_CAP / 4];
    static size_t seed_len[64];
    static unsigned char buf[FZ_CAP];
    long iters = 20000, it;
    int ns = 0, nt = 0, i;
    while (nt < 1000 && fz_token(nt)) nt++;
    while (ns < 64 && (seed_len[ns] = fz_seed(ns, seeds[ns], sizeof seeds[ns])) > 0) ns++;
    if (argc > 2 && strcmp(argv[1], "--write-seeds") == 0) {
        for (i = 0; i < ns; i++) {
            char p[1024];
            snprintf(p, sizeof p, "%s/seed-%02d", argv[2], i);
            fz_write(p, seeds[i], seed_len[i]);
        }
        printf("%d seeds written to %s\n", ns, argv[2]);
        return 0;
    }
    if (argc > 1) iters = atol(argv[1]);
    for (i = 0; i < ns; i++) LLVMFuzzerTestOneInput(seeds[i], seed_len[i]);
    for (it = 0; it < iters; it++) {
        int s = (int)(fz_rand() % (unsigned)ns);
        size_t len = seed_len[s], k, nmut = 1 + fz_rand() % 4;
        memcpy(buf, seeds[s], len);
        for (k = 0; k < nmut; k++) {
            size_t pos = len ? fz_rand() % (len + 1) : 0;
            switch (fz_rand() % 7) {
            case 0: if (pos < len) buf[pos] = (unsigned char)fz_rand(); break;                    /* replace */
            case 1: if (pos < len) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; } break; /* delete */
            case 2: if (fz_rand() % 4 == 0) len = pos; break;                                      /* truncate */
            case 3:                                                                                /* splice */
                if (ns > 1) {
                    int o = (int)(fz_rand() % (unsigned)ns);
                    size_t from = seed_len[o] ? fz_rand() % seed_len[o] : 0, n = seed_len[o] - from;
                    if (pos + n > FZ_CAP) n = FZ_CAP - pos;
                    memcpy(buf + pos, seeds[o] + from, n);
                    if (pos + n > len) len = pos + n;
                }
                break;
            case 4:                                                                                /* insert a byte */
                if (len < FZ_CAP) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = (unsigned char)fz_rand(); len++; }
                break;
            default: {                                                                             /* insert a token */
                const char *t = fz_token((int)(fz_rand() % (unsigned)nt));
                size_t tl = t[0] ? strlen(t) : 1;
                if (len + tl < FZ_CAP) {
                    memmove(buf + pos + tl, buf + pos, len - pos);
                    memcpy(buf + pos, t, tl);
                    len += tl;
                }
            }
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("%s: %d seeds and %ld mutated inputs, no failure\n", argv[0], ns, iters);
    return 0;
}
#else
FZ_UNUSED static void fz_unused(void) { (void)fz_seed; (void)fz_token; }   /* libFuzzer brings its own main */
#endif
#endif
