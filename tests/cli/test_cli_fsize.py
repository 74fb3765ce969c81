#!/usr/bin/env python3
"""A write past the file size limit (RLIMIT_FSIZE, `ulimit -f`; issue 27, item 8): SIGXFSZ must
not kill qk-gram or qk-gram-mpi and leave K's temporary file. The write fails with EFBIG, the
normal cleanup runs: exit 1, a message that names the file size limit, no temporary file, and a
previous K.npy left as it was. qk-gram with a profiler file past the limit (K fits): exit 1, no
temporary profiler file, a note that K was written.

usage: test_cli_fsize.py QK_GRAM [--mpirun MPIRUN --qk-gram-mpi QK_GRAM_MPI]
(exit 77 = skip when numpy is missing)"""
import os, resource, subprocess, sys, tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)

args = sys.argv[1:]
EXE = os.path.abspath(args[0])
MPIRUN = args[args.index("--mpirun") + 1] if "--mpirun" in args else None
MPI_EXE = os.path.abspath(args[args.index("--qk-gram-mpi") + 1]) if "--qk-gram-mpi" in args else None
failures = []
OLD = b"the previous K, not a .npy\n"


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def limit(nbytes):
    def f():
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    return f


def temps(d):
    return sorted(f for f in os.listdir(d) if ".tmp" in f)


with tempfile.TemporaryDirectory() as d:
    P = lambda f: os.path.join(d, f)
    rng = np.random.default_rng()

    # ---- qk-gram: K (300 x 300 float64, 720 KB) past a 100 KB limit ----
    np.save(P("X.npy"), rng.uniform(0, 3, size=(300, 3)))
    with open(P("K.npy"), "wb") as f:
        f.write(OLD)
    p = subprocess.run([EXE, "--map", "zz", "--x", P("X.npy"), "--out", P("K.npy"), "--device", "cpu", "--quiet"],
                       capture_output=True, text=True, preexec_fn=limit(100 * 1024), timeout=120)
    print(p.stderr.strip())
    check(p.returncode == 1, f"qk-gram past the file size limit: exit {p.returncode} (want 1; -25 or 153 is death by SIGXFSZ)")
    check("file size limit" in p.stderr and "102400" in p.stderr, "qk-gram: the message names the file size limit")
    check("K.npy" in p.stderr, "qk-gram: the message names K.npy")
    check(temps(d) == [], f"qk-gram: no temporary file left ({temps(d)})")
    check(open(P("K.npy"), "rb").read() == OLD, "qk-gram: the previous K.npy is left as it was")

    # ---- qk-gram: K fits (20 x 20), the HTML profiler report does not ----
    np.save(P("Xs.npy"), rng.uniform(0, 3, size=(20, 3)))
    base = [EXE, "--map", "zz", "--x", P("Xs.npy"), "--out", P("Ks.npy"), "--device", "cpu", "--quiet"]
    p = subprocess.run(base + ["--html", P("free.html")], capture_output=True, text=True, timeout=120)
    if p.returncode == 0 and os.path.getsize(P("free.html")) > 8192:
        os.remove(P("free.html"))
        os.remove(P("Ks.npy"))
        p = subprocess.run(base + ["--html", P("r.html")], capture_output=True, text=True, preexec_fn=limit(8192), timeout=120)
        print(p.stderr.strip())
        check(p.returncode == 1, f"qk-gram, HTML report past the limit: exit {p.returncode} (want 1)")
        check("file size limit" in p.stderr and "r.html" in p.stderr, "qk-gram, HTML report: the message names the limit and the file")
        check("was written" in p.stderr, "qk-gram, HTML report: a note says that K was written")
        check(not os.path.exists(P("r.html")), "qk-gram, HTML report: no report file")
        check(temps(d) == [], f"qk-gram, HTML report: no temporary file left ({temps(d)})")
    else:
        print(f"skip the profiler case (a build without the profiler, or a small report): exit {p.returncode}")

    # ---- qk-gram-mpi, 2 ranks: K (2000 x 2000 float64, 32 MB) past a 12 MB limit. The limit is
    # set in each rank (a python wrapper execs qk-gram-mpi), not on mpirun: its own shared-memory
    # files would hit it. 12 MB leaves room for MPI_Init's backing files. ----
    if MPIRUN and MPI_EXE:
        os.mkdir(P("mpi"))
        P = lambda f: os.path.join(d, "mpi", f)
        np.save(P("Xm.npy"), rng.uniform(0, 3, size=(2000, 3)))
        with open(P("Km.npy"), "wb") as f:
            f.write(OLD)
        # python ignores SIGXFSZ and an ignored signal stays ignored across exec: the wrapper
        # restores the default (death), what a shell's `ulimit -f; exec` gives
        wrap = ("import os, resource, signal, sys; h = resource.getrlimit(resource.RLIMIT_FSIZE)[1]; "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 20, h)); signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                "os.execv(sys.argv[1], sys.argv[1:])")
        # the environment of tests/mpi/test_mpi.py: root allowed, MPI's own allocations suppressed in
        # sanitizer builds, --oversubscribe for Open MPI
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_mca_base_component_disable_dlclose="1", PMIX_MCA_mca_base_component_disable_dlclose="1")
        supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi", "lsan_mpi.supp")
        env["LSAN_OPTIONS"] = ":".join(o for o in [env.get("LSAN_OPTIONS", ""), "suppressions=" + supp,
                                                   "fast_unwind_on_malloc=0", "print_suppressions=0"] if o)
        ver = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True, timeout=60, env=env)
        extra = ["--oversubscribe"] if ("Open MPI" in ver.stdout + ver.stderr or "OpenRTE" in ver.stdout + ver.stderr) else []
        cmd = [MPIRUN, "-n", "2"] + extra + [sys.executable, "-c", wrap, MPI_EXE, "--map", "zz", "--x", P("Xm.npy"),
                                             "--out", P("Km.npy"), "--threads", "1", "--quiet"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
            print(p.stderr.strip()[-3000:])
            check(p.returncode == 1, f"qk-gram-mpi past the file size limit: exit {p.returncode} (want 1; 153 is death by SIGXFSZ)")
            check("file size limit" in p.stderr and str(12 << 20) in p.stderr, "qk-gram-mpi: the message names the file size limit")
            check(temps(P("")) == [], f"qk-gram-mpi: no temporary file left ({temps(P(''))})")
            check(open(P("Km.npy"), "rb").read() == OLD, "qk-gram-mpi: the previous K.npy is left as it was")
        except subprocess.TimeoutExpired:
            check(False, "qk-gram-mpi past the file size limit: timed out")

print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
