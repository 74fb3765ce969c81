/* Fuzz target for qk_prof.h's QK_PROF_ADVICE parser (the advice thresholds from the environment,
   qk__prof_adv_parse). Input: the variable's value, up to a NUL. Properties checked on every
   input: the parser never crashes, reads out of bounds or writes past the step-zone buffer
   (ASan/UBSan); every threshold stays finite and non-zero (0 takes the default, as in
   desc.advice; nan, inf and values that are not whole numbers are skipped); a key absent from
   the input keeps its default, and the last item of a key with a plain decimal value (-?D.D,
   checked digit by digit) sets it; step_zone is set exactly when an item is "step_zone=...", within
   its buffer;
   and the thresholds written back as "key=value,..." (numbers with '.', whatever the locale)
   parse to the same thresholds and step zone (a fixed point). It runs in the de_DE.UTF-8 locale
   when the machine has it (',' is then the locale's decimal point: "0.5" must still be 0.5).

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_prof_advice.c -lm -pthread -o /tmp/fuzz_prof_advice
     /tmp/fuzz_prof_advice -runs=1000000 -dict=tests/fuzz/fuzz_prof_advice.dict /tmp/corpus-advice
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <locale.h>
#include <math.h>
#include "fuzz_common.h"

static const char *fz_token(int i) {
    static const char *const t[] = {
    "min_steps=", "pageable_min_bytes=", "sync_min_step_share=", "sync_min_idle_ns=", "idle_max_busy=",
    "idle_min_ns=", "short_kernel_ns=", "launch_min_kernels=", "launch_min_share=", "serial_min_copy_share=",
    "serial_max_overlap=", "leak_min_bytes=", "leak_min_step_share=", "step_skip=", "tail_ratio=",
    "drift_min_growth=", "thread_imbalance=", "rank_imbalance=", "imbalance_min_share=", "step_zone=", "step_zone",
    ",", "=", "0", "-1", "0.5", "1e308", "1e309", "-1e-320", "nan", "inf", "-inf", "0x1p3", "1,5", ".", "1e", "+",
    " ", "\t", "\xc3\xa9", "\x01", "", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    static const char *const seeds[] = {
        "short_kernel_ns=5000,leak_min_bytes=-1,step_zone=step", "tail_ratio=2.5", "imbalance_min_share=0.01",
        "foo,short_kernel_ns=5", "step_zone=a=b,=,,idle_max_busy=0.25", "tail_ratio=0,drift_min_growth=nan",
        "rank_imbalance=1e309,thread_imbalance=1.5e0,step_skip=-1", "min_steps=3,min_steps=7",
        "step_zone=a very long step zone name that does not fit in the ninety-six bytes of the buffer that holds it, "
        "no, it does not",
    };
    size_t n;
    if (i >= (int)(sizeof seeds / sizeof seeds[0])) return 0;
    n = strlen(seeds[i]);
    if (n > cap) return 0;
    memcpy(buf, seeds[i], n);
    return n;
}

/* The value of the last item of key in s (items: split at ',', the key up to the first '='), if
   it is a plain decimal -?D{1,6}(.D{1,6})?, computed digit by digit (not by strtod): 1 and *v,
   else 0 (no such item, or a value of another form: the parser may take or skip it). */
static int last_plain(const char *s, const char *key, double *v) {
    const char *item = s, *found = NULL;
    size_t kl = strlen(key), fl = 0;
    for (;;) {
        size_t il = strcspn(item, ",");
        if (il > kl && strncmp(item, key, kl) == 0 && item[kl] == '=') { found = item + kl + 1; fl = il - kl - 1; }
        if (!item[il]) break;
        item += il + 1;
    }
    if (!found) return 0;
    {
        size_t i = 0, d = 0, f = 0;
        double x = 0, scale = 1;
        int neg = found[0] == '-';
        i = (size_t)neg;
        while (i < fl && found[i] >= '0' && found[i] <= '9') { x = 10 * x + (found[i] - '0'); i++; d++; }
        if (i < fl && found[i] == '.') {
            i++;
            while (i < fl && found[i] >= '0' && found[i] <= '9') { scale /= 10; x += (found[i] - '0') * scale; i++; f++; }
            if (f == 0) return 0;
        }
        if (i != fl || d == 0 || d > 6 || f > 6) return 0;
        *v = neg ? -x : x;
        return 1;
    }
}

/* cfg as "key=value,...", numbers with '.' whatever the locale */
static void write_cfg(const qk_prof_advice_cfg *c, char *out, size_t cap) {
    size_t o = 0;
    int k;
    out[0] = 0;
    for (k = 0; k < QK__PROF_ADV_NKEYS; k++) {
        char num[64], *p;
        snprintf(num, sizeof num, "%.17g", QK__PROF_CFG(c, k));
        for (p = num; *p; p++) if (*p == ',') *p = '.';
        o += (size_t)snprintf(out + o, cap - o, "%s=%s,", qk__prof_adv_keys[k].key, num);
    }
    if (c->step_zone) snprintf(out + o, cap - o, "step_zone=%s", c->step_zone);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static int locale_set;
    char *s = (char *)malloc(size + 1), zone[96], zone2[96], back[2048];
    qk_prof_advice_cfg c, c2;
    int k;
    if (!locale_set) { locale_set = 1; setlocale(LC_NUMERIC, "de_DE.UTF-8"); }
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    memset(zone, 0x7f, sizeof zone);
    qk__prof_adv_cfg(NULL, &c, 0, NULL, 0);
    qk__prof_adv_parse(s, &c, zone, sizeof zone);
    for (k = 0; k < QK__PROF_ADV_NKEYS; k++) {
        char key[64];
        double v = QK__PROF_CFG(&c, k);
        FZ_CHECK(isfinite(v) && v != 0);
        snprintf(key, sizeof key, "%s=", qk__prof_adv_keys[k].key);
        if (!strstr(s, key)) FZ_CHECK(v == qk__prof_adv_keys[k].def);
        {   /* the last item of the key with a plain decimal value sets it (0: the default) */
            double want;
            if (last_plain(s, qk__prof_adv_keys[k].key, &want)) {
                if (want == 0) want = qk__prof_adv_keys[k].def;
                FZ_CHECK(fabs(v - want) <= 1e-12 * fabs(want));
            }
        }
    }
    /* an item begins the input or follows a ',' (values end at a ','): step_zone is set exactly
       when one of them is "step_zone=..." */
    FZ_CHECK(!c.step_zone == !(strncmp(s, "step_zone=", 10) == 0 || strstr(s, ",step_zone=")));
    if (c.step_zone) FZ_CHECK(c.step_zone == zone && memchr(zone, 0, sizeof zone) && !strchr(zone, ','));
    /* the fixed point: written back and parsed again, the same */
    write_cfg(&c, back, sizeof back);
    qk__prof_adv_cfg(NULL, &c2, 0, NULL, 0);
    qk__prof_adv_parse(back, &c2, zone2, sizeof zone2);
    for (k = 0; k < QK__PROF_ADV_NKEYS; k++) FZ_CHECK(QK__PROF_CFG(&c2, k) == QK__PROF_CFG(&c, k));
    FZ_CHECK(!c.step_zone == !c2.step_zone);
    if (c.step_zone) FZ_CHECK(strcmp(c.step_zone, c2.step_zone) == 0);
    free(s);
    return 0;
}
