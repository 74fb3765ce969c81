/* Fuzz target for qk-gram's command-line parser (parse_args and check_args in src/cli/qk-gram.c,
   which return an exit status instead of exiting). The input, split at NUL bytes, is argv[1..].
   Property checked on every input: no crash, out-of-bounds access or leak (ASan/UBSan/LSan);
   the result is "go on" (-1), 0 (--help / --version) or 2 (a bad command line), never anything
   else; when the parser goes on, the options hold valid values (device, precision, threads
   1..4096 or default, autotune mode, strings that are arguments or follow '=' in one); when the
   checks pass too, the mode has what it needs (--demo; --map, --x and a .npy --out; or --states
   and a .npy --out, without --map, --x, --y or --weights); --normalize and --norm-tol only with
   --states, --norm-tol in (0, 1); --gamma finite and > 0, only with --projected; --projected
   only in the --map mode, never with --tol or a --gpus list of several.

   libFuzzer (clang), from the repository root (docs/api.md, "Fuzzing"):
     clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
           tests/fuzz/fuzz_qk_gram_args.c -lm -pthread -o /tmp/fuzz_qk_gram_args
     /tmp/fuzz_qk_gram_args -runs=1000000 -dict=tests/fuzz/fuzz_qk_gram_args.dict /tmp/corpus-args
   With -DQK_FUZZ_STANDALONE: the seeds below and a fixed count of mutations (tests/fuzz/fuzz_common.h). */
#define QK_GRAM_NO_MAIN
#include "../../src/cli/qk-gram.c"
#include "fuzz_common.h"

/* the rest of qk-gram stays referenced by qk-gram.c itself (its QK_GRAM_NO_MAIN branch) */

static const char *fz_token(int i) {
    static const char *const t[] = {"", "--map", "--x", "--y", "--out", "--device", "--precision", "--weights", "--threads",
                                    "--data", "--profile", "--trace", "--html", "--cache-dir", "--quiet", "--demo",
                                    "--progress", "--no-sync", "--autotune", "--no-autotune", "--help", "--version", "-h",
                                    "--states", "--states-y", "--normalize", "--norm-tol", "1e-3", "1",
                                    "--projected", "--gamma", "0.5", "-1", "nan", "inf", "1e300", "--path", "mps", "statevector", "--tol", "--gpus", "0,1",
                                    "=", "cpu", "cuda", "auto", "fp32", "fp64", "tf32", "fp32x3", "fp16", "4096", "4097", "0", "K.npy", "K.csv",
                                    "X.npy", "./X.npy", "-", "/", NULL};
    return i < (int)(sizeof t / sizeof t[0]) ? t[i] : NULL;
}

static size_t fz_seed(int i, unsigned char *buf, size_t cap) {
    static const char seeds[][120] = {
        "--map\0zz(reps=2)\0--x\0X.npy\0--out\0K.npy",
        "--map=iqp\0--x=X.csv\0--y=Y.npy\0--out=K.npy\0--device\0cpu\0--precision=fp32\0--threads\0002\0--quiet",
        "--demo\0--data\0examples/data\0--no-autotune",
        "--x\0X.npy\0--out\0X.npy\0--map\0angle",
        "--version",
        "--states\0S.npy\0--states-y=B.npy\0--out\0K.npy\0--normalize\0--norm-tol\0001e-6",
        "--projected\0--gamma\0000.5\0--map\0zz\0--x\0X.npy\0--y=Y.npy\0--out\0K.npy\0--precision=fp32",
        "--projected\0--map\0zz\0--x\0X.npy\0--out\0K.npy\0--device\0cuda\0--path=mps\0--gpus\0001",
    };
    size_t n = 0;
    if (i >= (int)(sizeof seeds / sizeof seeds[0])) return 0;
    while (n + 1 < sizeof seeds[i] && !(seeds[i][n] == 0 && seeds[i][n + 1] == 0)) n++;
    if (n > cap) return 0;
    memcpy(buf, seeds[i], n);
    return n;
}

/* s is argv[k] or points just past its '=' */
static int from_args(const char *s, char **argv, int argc) {
    int k;
    if (!s) return 1;
    for (k = 1; k < argc; k++) {
        const char *eq = strchr(argv[k], '=');
        if (s == argv[k] || (eq && s == eq + 1)) return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *copy, *argv[66];
    int argc = 1, rc;
    size_t i, start = 0;
    options o;
    quiet_msgs = 1;
    copy = (char *)malloc(size + 1);
    FZ_CHECK(copy != NULL);
    if (size) memcpy(copy, data, size);
    copy[size] = 0;
    argv[0] = (char *)"qk-gram";
    for (i = 0; i <= size && argc < 65; i++)
        if (copy[i] == 0) { argv[argc++] = copy + start; start = i + 1; }
    argv[argc] = NULL;
    rc = parse_args(argc, argv, &o);
    FZ_CHECK(rc == -1 || rc == 0 || rc == EXIT_USAGE);
    if (rc == -1) {
        FZ_CHECK(o.device >= QK_DEVICE_AUTO && o.device <= QK_DEVICE_CUDA);
        FZ_CHECK(o.precision >= QK_PRECISION_DEFAULT && (int)o.precision < QK_PRECISION_COUNT);
        FZ_CHECK(o.threads >= 0 && o.threads <= 4096 && o.autotune >= -1 && o.autotune <= 1);
        FZ_CHECK(from_args(o.map, argv, argc) && from_args(o.x, argv, argc) && from_args(o.y, argv, argc));
        FZ_CHECK(from_args(o.out, argv, argc) && from_args(o.weights, argv, argc) && from_args(o.data, argv, argc));
        FZ_CHECK(from_args(o.states, argv, argc) && from_args(o.states_y, argv, argc));
        FZ_CHECK(o.norm_tol == 0.0 || (o.norm_tol > 0.0 && o.norm_tol < 1.0));
        FZ_CHECK(o.gamma == 0.0 || (o.gamma > 0.0 && o.gamma < 1e300));
        FZ_CHECK(o.projected == 0 || o.projected == 1);
        rc = check_args(&o);
        FZ_CHECK(rc == -1 || rc == EXIT_USAGE);
        if (rc == -1) {
            const int states = o.states && !o.map && !o.x && !o.y && !o.weights && o.out && qkcli_ends_with(o.out, ".npy");
            FZ_CHECK(o.demo || (o.map && o.x && o.out && qkcli_ends_with(o.out, ".npy") && !o.states && !o.states_y) || states);
            FZ_CHECK(o.states || (!o.normalize && o.norm_tol == 0.0));
            FZ_CHECK(o.projected || o.gamma == 0.0);
            FZ_CHECK(!o.projected || (o.map && o.x && !o.demo && !o.states && o.tol == 0.0 && o.n_gpus <= 1));
        }
    }
    free(copy);
    return 0;
}
