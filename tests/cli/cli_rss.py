"""Peak resident memory of qk-gram where it does no GPU work: --version, --help and a small job on
the CPU engine must each stay under LIMIT_MB (issue 16: a CUDA build linked cuBLAS, and the
dynamic loader's mapping and relocation of libcublas and libcublasLt took 219 MB before main;
qk_cuda.cu now opens cuBLAS on first use). The peak is the child's own (os.wait4's
ru_maxrss, KB on Linux). Skipped (exit 77) where that is not measurable.

usage: cli_rss.py QK_GRAM"""
import os
import random
import subprocess
import sys
import tempfile

LIMIT_MB = 40


TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def peak_mb(args):
    """(exit status, peak RSS in MB, stderr). Through GNU time (%M) where it exists: a child
    forked from Python starts from Python's own RSS (Linux keeps the high-water mark across
    exec), a floor of about 14 MB; GNU time's is about 2 MB."""
    if TIME:
        r = subprocess.run([TIME, "-f", "QK_RSS_KB %M"] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = r.stderr.decode(errors="replace")
        kb = [l.split()[1] for l in err.splitlines() if l.startswith("QK_RSS_KB ")]
        if kb:
            return r.returncode, int(kb[-1]) / 1024.0, err
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    return p.returncode, ru.ru_maxrss / 1024.0, err


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not sys.platform.startswith("linux") or not hasattr(os, "wait4"):
        print("SKIP: ru_maxrss of a child is measured on Linux only")
        return 77
    exe = sys.argv[1]
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        x = os.path.join(d, "X.csv")
        rng = random.Random(7)
        with open(x, "w") as f:
            for _ in range(40):
                f.write(",".join("%.6f" % rng.uniform(0, 3) for _ in range(4)) + "\n")
        cases = [("--version", [exe, "--version"]), ("--help", [exe, "--help"]),
                 ("cpu job", [exe, "--map", "zz(reps=2)", "--x", x, "--out", os.path.join(d, "K.npy"),
                              "--device", "cpu", "--threads", "2", "--quiet"])]
        for name, args in cases:
            rc, mb, err = peak_mb(args)
            ok = rc == 0 and mb < LIMIT_MB
            print("%-10s exit %d, peak RSS %.1f MB (limit %d MB)%s" % (name, rc, mb, LIMIT_MB, "" if ok else "  FAIL " + err.strip()[-300:]))
            fails += not ok
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
