#!/usr/bin/env python3
"""qk-gram end to end: K against an independent numpy statevector computation, --demo accuracy,
and every bad input (non-zero exit, a message that says what and where, no output file).

usage: test_cli.py PATH/TO/qk-gram     (meson passes it; exit 77 = skip when numpy is missing)

The reference is written here from the circuit definition (Qiskit's ZZFeatureMap), not from qk:
per rep, H on every qubit, P(alpha x_i) on qubit i, and for each pair (i, j) of the pattern
CX(i,j) P(alpha (pi - x_i)(pi - x_j)) on j CX(i,j). Qubit 0 is the least significant bit. The
CX-P-CX sandwich multiplies the basis state by e^{i t} exactly when bit_i XOR bit_j is 1, which is
how it is applied below. Tolerances: 1e-10 (fp64), 1e-5 absolute (fp32 output).
"""
import os
import re
import subprocess
import sys
import tempfile

from cli_common import EXE, check, failures, need_numpy, seeded_rng

np = need_numpy("numpy is not installed: skipping the qk-gram tests")


def zz_states(X, reps=2, alpha=2.0, pairs=None):
    n, q = X.shape
    dim = 1 << q
    idx = np.arange(dim)
    bit = [(idx >> k) & 1 for k in range(q)]
    if pairs is None:
        pairs = [(i, j) for i in range(q) for j in range(i + 1, q)]
    S = np.empty((n, dim), complex)
    for s in range(n):
        x = X[s]
        psi = np.zeros(dim, complex)
        psi[0] = 1.0
        for _ in range(reps):
            for k in range(q):
                lo = idx[bit[k] == 0]
                hi = lo | (1 << k)
                a, b = psi[lo].copy(), psi[hi].copy()
                psi[lo] = (a + b) / np.sqrt(2.0)
                psi[hi] = (a - b) / np.sqrt(2.0)
            for k in range(q):
                psi = psi * np.where(bit[k] == 1, np.exp(1j * alpha * x[k]), 1.0)
            for i, j in pairs:
                t = alpha * (np.pi - x[i]) * (np.pi - x[j])
                psi = psi * np.where((bit[i] ^ bit[j]) == 1, np.exp(1j * t), 1.0)
        S[s] = psi
    return S


def kernel(SA, SB):
    return np.abs(SA.conj() @ SB.T) ** 2


# Under a sanitizer build a leak (or any report) exits 23, never the 1 that an expected error gives.
ENV = dict(os.environ)
for var in ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"):
    ENV[var] = (ENV[var] + ":" if ENV.get(var) else "") + "exitcode=23"


def run(*args):
    # the checks compare with an exact fp64 reference: they run on the CPU engine unless the call
    # names a device (one check below runs --device auto, the GPU where one exists)
    if "--device" not in args:
        args = args + ("--device", "cpu")
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120, env=ENV)


def leftovers(d):
    return sorted(f for f in os.listdir(d) if ".tmp." in f)


rng, seed = seeded_rng()

with tempfile.TemporaryDirectory(prefix="qk-test-cli-") as d:
    P = lambda name: os.path.join(d, name)
    ENV["QK_CACHE_DIR"] = d     # GPU autotune writes its cache here, not into the user's home
    nx, ny, nf = 13, 7, 4       # sizes that are not multiples of any tile
    X = rng.uniform(0, np.pi, (nx, nf))
    Y = rng.uniform(0, np.pi, (ny, nf))
    np.save(P("X.npy"), X)
    np.save(P("Y.npy"), Y)
    SX, SY = zz_states(X), zz_states(Y)
    KXX, KXY = kernel(SX, SX), kernel(SX, SY)

    # ---- K(X, X), fp64 ----
    r = run("--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("K.npy"))
    check(r.returncode == 0, "K(X,X) exits 0: " + r.stderr)
    if r.returncode == 0:
        K = np.load(P("K.npy"))
        check(K.dtype == np.float64 and K.shape == (nx, nx), "K(X,X) dtype/shape %s %s" % (K.dtype, K.shape))
        err = np.max(np.abs(K - KXX))
        check(err <= 1e-10, "K(X,X) vs numpy: max abs err %.3g > 1e-10" % err)
    # ---- the same through --device auto (the CUDA engine where a GPU exists), fp64 ----
    r = run("--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("Ka.npy"), "--device", "auto", "--precision", "fp64")
    check(r.returncode == 0, "K(X,X) --device auto exits 0: " + r.stderr)
    if r.returncode == 0:
        Ka = np.load(P("Ka.npy"))
        err = np.max(np.abs(Ka - KXX)) if Ka.shape == KXX.shape else float("inf")
        check(Ka.dtype == np.float64 and err <= 1e-9, "K(X,X) --device auto fp64 vs numpy: %s, max abs err %.3g" % (Ka.dtype, err))
        check("pairs" in r.stdout and "Gpairs/s" in r.stdout, "summary printed: " + r.stdout)
        check("plan" in r.stdout, "plan printed")
        check("\r" not in r.stderr, "no progress bar when stderr is not a terminal")

    # ---- K(X, Y) from CSV (with a header), fp32 output, linear entanglement ----
    with open(P("Y.csv"), "w") as f:
        f.write("a,b,c,d\n")
        for row in Y:
            f.write(",".join("%.17g" % v for v in row) + "\n")
    r = run("--map", "zz(reps=2,ent=linear)", "--x", P("X.npy"), "--y", P("Y.csv"), "--out", P("Kxy.npy"),
            "--precision", "fp32", "--device", "cpu", "--threads", "2")
    check(r.returncode == 0, "K(X,Y) csv exits 0: " + r.stderr)
    if r.returncode == 0:
        K = np.load(P("Kxy.npy"))
        lin = [(i, i + 1) for i in range(nf - 1)]
        ref = kernel(zz_states(X, pairs=lin), zz_states(Y, pairs=lin))
        check(K.dtype == np.float32 and K.shape == (nx, ny), "K(X,Y) dtype/shape %s %s" % (K.dtype, K.shape))
        err = np.max(np.abs(K - ref))
        check(err <= 1e-5, "K(X,Y) linear fp32 vs numpy: max abs err %.3g > 1e-5" % err)

    # ---- the tensor-core precision names on the CPU engine: computed in fp64, float32 out, said so ----
    for prec in ("tf32", "fp32x3", "fp16"):
        r = run("--map", "zz(reps=2,ent=linear)", "--x", P("X.npy"), "--y", P("Y.csv"), "--out", P("Kp.npy"),
                "--precision", prec, "--device", "cpu", "--threads", "2")
        check(r.returncode == 0, "--precision %s on the CPU engine exits 0: %s" % (prec, r.stderr))
        if r.returncode == 0:
            Kp = np.load(P("Kp.npy"))
            check(Kp.dtype == np.float32 and np.array_equal(Kp, np.load(P("Kxy.npy"))),
                  "--precision %s on the CPU engine: float32 K equal to fp32's" % prec)
            check("computes in fp64" in r.stdout, "--precision %s: the plan says the CPU engine computes in fp64: %s" % (prec, r.stdout))
    # ---- --precision auto --tol: the CPU engine computes in fp64 (meets any tol), float64 as the default ----
    r = run("--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("Kauto.npy"), "--device", "cpu", "--precision", "auto", "--tol", "1e-3")
    check(r.returncode == 0, "--precision auto --tol 1e-3 on the CPU engine exits 0: %s" % r.stderr)
    if r.returncode == 0:
        Kauto = np.load(P("Kauto.npy"))
        check(Kauto.dtype == np.float64 and np.max(np.abs(Kauto - KXX)) <= 1e-10, "--precision auto on the CPU: fp64 K")
        check("auto" in r.stdout and "computes in fp64" in r.stdout, "--precision auto: the plan says why: %s" % r.stdout)
    for bad in (["--precision", "fp32", "--tol", "1e-3"], ["--precision", "auto", "--tol", "abc"], ["--precision", "auto", "--tol", "0"],
                ["--precision", "auto", "--tol", "2"]):
        r = run("--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("Kbad.npy"), "--device", "cpu", *bad)
        check(r.returncode == 2 and "--tol" in r.stderr and not os.path.exists(P("Kbad.npy")),
              "%s: usage error (rc %d): %s" % (" ".join(bad), r.returncode, r.stderr))
    r = run("--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("Kbad.npy"), "--precision", "bf17")
    check(r.returncode == 2 and "fp32x3" in r.stderr and not os.path.exists(P("Kbad.npy")),
          "--precision bf17: usage error naming the modes (rc %d): %s" % (r.returncode, r.stderr))

    # ---- inputs in other dtypes / byte orders / header versions give the same K ----
    Xf = X.astype(">f8")
    with open(P("Xbe.npy"), "wb") as f:
        np.lib.format.write_array(f, Xf, version=(3, 0))
    r = run("--map", "zz(reps=2)", "--x", P("Xbe.npy"), "--y", P("Y.npy"), "--out", P("Kbe.npy"), "--quiet")
    check(r.returncode == 0, "big-endian v3 input exits 0: " + r.stderr)
    check(r.stdout == "", "--quiet prints nothing: " + r.stdout)
    if r.returncode == 0:
        err = np.max(np.abs(np.load(P("Kbe.npy")) - KXY))
        check(err <= 1e-10, "K(X,Y) from big-endian X: max abs err %.3g" % err)

    # ---- Fortran order (np.save of an F-contiguous array: pandas' df.to_numpy() of a
    # one-dtype frame, X.T of a C array, np.asfortranarray): read, transposed, the same K bit
    # for bit as from the C-order file; other dtypes numpy writes give K of the values read ----
    try:
        import pandas as pd
        XF = pd.DataFrame(X, columns=list("abcd")).to_numpy()
    except ImportError:
        XF = np.asfortranarray(X)   # what to_numpy() returns for a one-dtype DataFrame
    check(XF.flags.f_contiguous and not XF.flags.c_contiguous, "the Fortran-order input is F-contiguous")
    np.save(P("XF.npy"), XF)
    np.save(P("YF.npy"), np.ascontiguousarray(Y.T).T)
    check(b"'fortran_order': True" in open(P("XF.npy"), "rb").read(200), "np.save wrote fortran_order True")
    r = run("--map", "zz(reps=2)", "--x", P("XF.npy"), "--out", P("KF.npy"))
    check(r.returncode == 0, "Fortran-order X exits 0: " + r.stderr)
    if r.returncode == 0:
        check(np.array_equal(np.load(P("KF.npy")), np.load(P("K.npy"))), "K(X,X) from Fortran-order X == from C-order X (bitwise)")
    r = run("--map", "zz(reps=2)", "--x", P("XF.npy"), "--y", P("YF.npy"), "--out", P("KFY.npy"))
    check(r.returncode == 0, "Fortran-order X and Y exit 0: " + r.stderr)
    if r.returncode == 0:
        err = np.max(np.abs(np.load(P("KFY.npy")) - KXY))
        check(err <= 1e-10, "K(X,Y) from Fortran-order X, Y vs numpy: max abs err %.3g" % err)
    for name, arr, ver in (("F-order big-endian float32 v2", np.asfortranarray(X.astype(">f4")), (2, 0)),
                           ("float16", X.astype(np.float16), (1, 0)),
                           ("F-order uint8", np.asfortranarray(np.round(X).astype(np.uint8)), (1, 0)),
                           ("int16 v3", np.round(X * 10).astype("<i2"), (3, 0))):
        with open(P("Xd.npy"), "wb") as f:
            np.lib.format.write_array(f, arr, version=ver)
        r = run("--map", "zz(reps=2)", "--x", P("Xd.npy"), "--out", P("Kd.npy"))
        check(r.returncode == 0, "%s X exits 0: %s" % (name, r.stderr))
        if r.returncode == 0:
            Xd = np.load(P("Xd.npy")).astype(np.float64)
            Sd = zz_states(Xd)
            err = np.max(np.abs(np.load(P("Kd.npy")) - kernel(Sd, Sd)))
            check(err <= 1e-10, "%s X: K of the values np.load reads, max abs err %.3g" % (name, err))
    # weights in Fortran order: taken in the row-major order of the array np.load returns
    W = rng.uniform(-1, 1, (2, nf))   # hea(layers=2): layers x qubits weights
    np.save(P("WF.npy"), np.asfortranarray(W))
    np.save(P("WC.npy"), W)
    r1 = run("--map", "hea(layers=2)", "--x", P("X.npy"), "--weights", P("WF.npy"), "--out", P("KwF.npy"))
    r2 = run("--map", "hea(layers=2)", "--x", P("X.npy"), "--weights", P("WC.npy"), "--out", P("KwC.npy"))
    check(r1.returncode == 0 and r2.returncode == 0, "hea with C and Fortran-order weights: %s %s" % (r1.stderr, r2.stderr))
    if r1.returncode == 0 and r2.returncode == 0:
        check(np.array_equal(np.load(P("KwF.npy")), np.load(P("KwC.npy"))), "K with Fortran-order weights == with C-order weights")
    np.save(P("Xc.npy"), X.astype(np.complex128))
    bad_c = run("--map", "zz", "--x", P("Xc.npy"), "--out", P("Kc.npy"))
    check(bad_c.returncode == 1 and "<c16" in bad_c.stderr and not os.path.exists(P("Kc.npy")),
          "complex input refused, naming its dtype: " + bad_c.stderr)

    # ---- --demo ----
    r = run("--demo")
    m = re.search(r"test accuracy: ([0-9.]+)", r.stdout)
    check(r.returncode == 0 and m is not None, "--demo runs and prints an accuracy: " + r.stdout + r.stderr)
    if m:
        check(float(m.group(1)) >= 0.8, "--demo accuracy %s >= 0.8" % m.group(1))
    r = run("--demo", "--data", P("nowhere"))
    check(r.returncode != 0 and "iris.csv" in r.stderr, "--demo with a wrong --data fails clearly: " + r.stderr)

    r = run("--help")
    check(r.returncode == 0 and "--map" in r.stdout and "--demo" in r.stdout, "--help")

    # ---- bad inputs: non-zero exit, a message that says where, no output file ----
    def bad(name, args, want, out="bad.npy", code=1):
        outp = P(out) if not os.path.isabs(out) else out
        r = run(*args, "--out", outp)
        check(r.returncode == code, "%s: exit %d (want %d); stderr: %s" % (name, r.returncode, code, r.stderr))
        for w in want:
            check(w in r.stderr, "%s: message lacks %r: %s" % (name, w, r.stderr))
        check(not os.path.exists(outp), "%s: output file exists" % name)
        check(leftovers(d) == [], "%s: temporary files left: %s" % (name, leftovers(d)))

    Xn = X.copy()
    bi, bj = int(rng.integers(nx)), int(rng.integers(nf))
    Xn[bi, bj] = np.nan
    np.save(P("Xnan.npy"), Xn)
    bad("NaN in X", ["--map", "zz", "--x", P("Xnan.npy")], ["X[%d][%d]" % (bi, bj), "NaN"])
    Xi = X.copy()
    Xi[bi, bj] = -np.inf
    np.savetxt(P("Xinf.csv"), Xi, delimiter=",")
    bad("Inf in X (csv)", ["--map", "zz", "--x", P("Xinf.csv")], ["X[%d][%d]" % (bi, bj), "Inf"])
    Yn = Y.copy()
    Yn[2, 1] = np.nan
    np.save(P("Ynan.npy"), Yn)
    bad("NaN in Y", ["--map", "zz", "--x", P("X.npy"), "--y", P("Ynan.npy")], ["Y[2][1]"])

    np.save(P("Y3.npy"), Y[:, :3])
    bad("feature count mismatch", ["--map", "zz", "--x", P("X.npy"), "--y", P("Y3.npy")],
        ["feature count mismatch", "4", "3"])

    bad("bad spec (unknown value)", ["--map", "zz(reps=2,ent=bogus)", "--x", P("X.npy")], ["bogus", "column 15"])
    bad("bad spec (unknown map)", ["--map", "zzz(reps=2)", "--x", P("X.npy")], ["zzz", "column 1"])
    r = run("--map", "zz(reps=2,ent=bogus)", "--x", P("X.npy"), "--out", P("bad.npy"))
    lines = r.stderr.splitlines()
    caret = [i for i, l in enumerate(lines) if l.strip() == "^"]
    check(len(caret) == 1 and caret[0] > 0 and lines[caret[0] - 1][lines[caret[0]].index("^")] == "b",
          "caret points at the bad token: %r" % r.stderr)

    bad("missing input", ["--map", "zz", "--x", P("missing.npy")], ["missing.npy"])
    bad("missing Y", ["--map", "zz", "--x", P("X.npy"), "--y", P("missing.csv")], ["missing.csv"])
    bad("unknown input type", ["--map", "zz", "--x", P("X.txt")], ["neither .npy nor .csv"])
    bad("unwritable output (no such dir)", ["--map", "zz", "--x", P("X.npy")], ["does not exist"],
        out=P("no/such/dir/K.npy"))
    if os.geteuid() != 0:   # root writes anywhere
        os.mkdir(P("ro"), 0o555)
        bad("unwritable output (read-only dir)", ["--map", "zz", "--x", P("X.npy")], ["not writable"],
            out=P("ro/K.npy"))
    os.mkdir(P("adir.npy"))
    r = run("--map", "zz", "--x", P("X.npy"), "--out", P("adir.npy"))
    check(r.returncode == 1 and "directory" in r.stderr, "--out is a directory: " + r.stderr)

    A = rng.uniform(-1, 1, (6, 4))
    zr = int(rng.integers(6))
    A[zr] = 0.0
    np.save(P("A.npy"), A)
    bad("zero-norm amplitude row", ["--map", "amplitude", "--x", P("A.npy")], ["row %d" % zr, "norm"])

    np.save(P("X1d.npy"), X[:, 0])
    bad("1-D input", ["--map", "zz", "--x", P("X1d.npy")], ["1-D"])
    with open(P("trunc.npy"), "wb") as f:
        f.write(open(P("X.npy"), "rb").read()[:-3])
    bad("truncated input", ["--map", "zz", "--x", P("trunc.npy")], ["truncated"])
    bad("wrong weight count", ["--map", "hea(layers=1)", "--x", P("X.npy"), "--weights", P("Y.npy")], ["weights"])

    # A failing run leaves an existing output file exactly as it was.
    np.save(P("keep.npy"), KXX)
    before = open(P("keep.npy"), "rb").read()
    r = run("--map", "zz", "--x", P("Xnan.npy"), "--out", P("keep.npy"))
    check(r.returncode == 1 and open(P("keep.npy"), "rb").read() == before, "failed run keeps the old output")

    # ---- issue 14 / 16: inputs that used to be misread, hang, or be overwritten ----
    np.save(P("X04.npy"), np.zeros((0, 4)))
    bad("(0, 4) input", ["--map", "zz", "--x", P("X04.npy")], ["shape (0, 4)"])
    np.save(P("X50.npy"), np.zeros((5, 0)))
    bad("(5, 0) input", ["--map", "zz", "--x", P("X50.npy")], ["shape (5, 0)"])
    np.save(P("X12.npy"), np.arange(12.0))
    bad("1-D input names its shape", ["--map", "zz", "--x", P("X12.npy")], ["shape (12,)"])
    Xh = X.copy()
    Xh[3] = 1e300
    np.save(P("Xhuge.npy"), Xh)
    bad("finite but huge features", ["--map", "zz", "--x", P("Xhuge.npy")], ["X row 3", "op ", "1e+300"])
    with open(P("nul.csv"), "wb") as f:
        f.write(b"1,\x00 2\n3,4\n")
    bad("NUL byte in a CSV", ["--map", "zz", "--x", P("nul.csv")], ["line 1", "control byte"])
    with open(P("empty1.csv"), "w") as f:
        f.write(",2\n3,4\n")
    bad("empty first field", ["--map", "zz", "--x", P("empty1.csv")], ["line 1, column 1: empty field"])
    with open(P("pandas.csv"), "w") as f:   # what DataFrame.to_csv writes with its default index=True
        f.write(",a,b\n0,0.5,1.5\n1,2.5,0.25\n")
    bad("pandas index column", ["--map", "zz", "--x", P("pandas.csv")], ["index=False"])
    with open(P("semi.csv"), "w") as f:     # a German Excel export: ';' between fields, ',' decimals
        f.write("5,1;3,5\n4,9;3,0\n")
    bad("semicolon CSV", ["--map", "zz", "--x", P("semi.csv")], ["line 1", "';'"])
    with open(P("semi2.csv"), "w") as f:
        f.write("1;2\n3;4\n")
    bad("semicolon CSV, integers", ["--map", "zz", "--x", P("semi2.csv")], ["line 1", "';'"])
    os.mkfifo(P("fifo.csv"))
    bad("FIFO input (open used to block forever)", ["--map", "zz", "--x", P("fifo.csv")], ["FIFO"])
    bad("huge reps (found by fuzzing qk_map_parse)", ["--map", "iqp(reps=75555550)", "--x", P("X.npy")], ["QK_MAX_REPS"])
    bad("reps=2000000000 is an integer", ["--map", "iqp(reps=2000000000)", "--x", P("X.npy")], ["maximum"])
    bad("unknown parameter lists the map's", ["--map", "zz(rep=2)", "--x", P("X.npy")], ["'rep'", "reps, alpha, ent, qubits"])
    # --out naming an input: refused (exit 2), the input untouched
    before = open(P("X.npy"), "rb").read()
    os.link(P("X.npy"), P("Xlink.npy"))
    os.symlink(P("X.npy"), P("Xsym.npy"))
    for out, why in ((P("X.npy"), "same path"), (os.path.join(d, ".", "X.npy"), "./ path"), (P("Xlink.npy"), "hard link"),
                     (P("Xsym.npy"), "symlink")):
        r = run("--map", "zz", "--x", P("X.npy"), "--out", out)
        check(r.returncode == 2 and "same file" in r.stderr, "--out = --x (%s): exit %d, %s" % (why, r.returncode, r.stderr))
        check(open(P("X.npy"), "rb").read() == before, "--out = --x (%s): X.npy overwritten" % why)
    r = run("--map", "zz", "--x", P("X.npy"), "--y", P("Y.npy"), "--out", P("Y.npy"))
    check(r.returncode == 2 and "--y" in r.stderr, "--out = --y refused: " + r.stderr)
    check(leftovers(d) == [], "no temporary file after the refusals")
    os.remove(P("Xlink.npy"))
    os.remove(P("Xsym.npy"))

    # ---- issue 27, item 10: command-line values are echoed escaped and cut ----
    for name, args, code in (("--map with ESC", ["--map", "zz\x1b[2J", "--x", P("X.npy")], 1),
                             ("--x with ESC", ["--map", "zz", "--x", P("ok\x1b[2J.npy")], 1),
                             ("--y with ESC and a C1 CSI", ["--map", "zz", "--x", P("X.npy"), "--y", P("y\x1b]0;t\x07\x9b.npy")], 1),
                             ("--weights with ESC", ["--map", "zz", "--x", P("X.npy"), "--weights", P("w\x1b[2J.npy")], 1),
                             ("--device with ESC", ["--map", "zz", "--x", P("X.npy"), "--device", "\x1b[2J"], 2),
                             ("--threads with ESC", ["--map", "zz", "--x", P("X.npy"), "--threads", "\x1b[2J"], 2),
                             ("unknown option with ESC", ["--map", "zz", "--x", P("X.npy"), "--\x1b[2J"], 2)):
        r = run(*args, "--out", P("bad.npy"))
        check(r.returncode == code, "%s: exit %d (want %d): %r" % (name, r.returncode, code, r.stderr))
        check("\x1b" not in r.stderr and "\x07" not in r.stderr and "\x9b" not in r.stderr,
              "%s: raw control bytes in stderr: %r" % (name, r.stderr))
        check("\\x1b" in r.stderr, "%s: the escape is not shown as \\x1b: %r" % (name, r.stderr))
        check(not os.path.exists(P("bad.npy")), "%s: output file exists" % name)
    big = "zz(" + "a" * 120000 + ")"
    r = run("--map", big, "--x", P("X.npy"), "--out", P("bad.npy"))
    check(r.returncode == 1 and len(r.stderr) < 2000 and "(120004 bytes)" in r.stderr,
          "a 120000-character spec: exit %d, %d bytes of stderr: %r" % (r.returncode, len(r.stderr), r.stderr[:600]))
    r = run("--map", "zz", "--x", P("x" * 120000 + ".npy"), "--out", P("bad.npy"))
    check(r.returncode == 1 and len(r.stderr) < 2000, "a 120000-character --x: exit %d, %d bytes of stderr" % (r.returncode, len(r.stderr)))
    r = run("--map", "zz", "--x", P("X.npy"), "--device", "d" * 120000, "--out", P("bad.npy"))
    check(r.returncode == 2 and len(r.stderr) < 2000 and "bytes)" in r.stderr,
          "a 120000-character --device: exit %d, %d bytes of stderr" % (r.returncode, len(r.stderr)))
    # ---- issue 27, item 3: a first row of quoted numbers is data, not a header ----
    with open(P("q.csv"), "w") as f:
        f.write('"0.1","0.2","0.3","0.4"\n0.3,0.4,0.5,0.6\n0.5,0.6,0.7,0.8\n')
    r = run("--map", "zz", "--x", P("q.csv"), "--out", P("Kq.npy"))
    check(r.returncode == 0 and "(3 x 4)" in r.stdout and np.load(P("Kq.npy")).shape == (3, 3),
          "quoted first row read as data: exit %d, %s %s" % (r.returncode, r.stdout, r.stderr))
    with open(P("na.csv"), "w") as f:
        f.write("NA,NA,NA,NA\n0.3,0.4,0.5,0.6\n0.5,0.6,0.7,0.8\n")
    bad("NA,NA first row", ["--map", "zz", "--x", P("na.csv")], ["line 1, column 1: 'NA' is not a number"])

    # docs/cli.md documents every option that --help lists
    r = run("--help")
    opts = sorted(set(re.findall(r"(--[a-z][a-z-]*)", r.stdout)))
    doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "cli.md")).read()
    check(len(opts) >= 20, "--help lists the options: %s" % opts)
    for o in opts:
        check(("`%s" % o) in doc, "docs/cli.md does not document %s" % o)

    # Command-line errors exit 2.
    bad("--out K.csv (docs: 2 = bad command line)", ["--map", "zz", "--x", P("X.npy")], [".npy"], out="K.csv", code=2)
    bad("option given twice", ["--map", "zz", "--x", P("X.npy"), "--x", P("Y.npy")], ["twice"], code=2)
    bad("value for a flag", ["--map", "zz", "--x", P("X.npy"), "--quiet=yes"], ["no value"], code=2)
    bad("unknown option", ["--map", "zz", "--x", P("X.npy"), "--frobnicate"], ["--frobnicate"], code=2)
    bad("bad --device", ["--map", "zz", "--x", P("X.npy"), "--device", "tpu"], ["tpu"], code=2)
    bad("bad --threads", ["--map", "zz", "--x", P("X.npy"), "--threads", "0"], ["--threads"], code=2)
    bad("bad --gpus", ["--map", "zz", "--x", P("X.npy"), "--gpus", "0,x"], ["--gpus"], code=2)
    bad("--gpus listing a device twice", ["--map", "zz", "--x", P("X.npy"), "--gpus", "1,1"], ["twice"], code=2)
    bad("--gpus with an empty ordinal", ["--map", "zz", "--x", P("X.npy"), "--gpus", "0,"], ["--gpus"], code=2)
    # --gpus on the CPU engine is accepted and unused (the context runs on the CPU)
    r = run("--map", "zz", "--x", P("X.npy"), "--out", P("Kg.npy"), "--device", "cpu", "--gpus", "0,1", "--quiet")
    check(r.returncode == 0 and os.path.exists(P("Kg.npy")), "--gpus 0,1 with --device cpu: exit %d, %s" % (r.returncode, r.stderr))
    r = run("--map", "zz", "--x", P("X.npy"), "--out", P("Kg.npy"), "--device", "cpu", "--gpus", "all", "--quiet")
    check(r.returncode == 0, "--gpus all with --device cpu: exit %d, %s" % (r.returncode, r.stderr))
    r = run("--map", "zz", "--x", P("X.npy"))
    check(r.returncode == 2 and "--out" in r.stderr, "missing --out exits 2: " + r.stderr)

if failures:
    print("test_cli: %d checks FAILED (seed %d)" % (len(failures), seed))
    sys.exit(1)
print("test_cli: all checks passed")
