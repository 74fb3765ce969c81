#!/usr/bin/env python3
"""qk-gram --states, end to end on the CPU engine (docs/cli.md "K from given states"): K of
states written with numpy equals the explicit |A B^H|^2 and the --map path's K on the same data;
complex64, float64, float32, float16 / integer, big-endian and Fortran-order inputs; two files
of different dtypes; density matrices against Tr(rho sigma) from numpy (and a pure side against
a mixed one: <psi|rho|psi>); --normalize and --norm-tol; validation errors that name the row or
the file (exit 1, no output, a previous K.npy untouched) and command-line errors (exit 2);
SIGINT / SIGTERM during a long --states job (exit 130 / 143, no K.npy, no temporary left, the
stop within about a second of CPU time); a write past ulimit -f (exit 1, no temporary).

usage: test_cli_states.py PATH/TO/qk-gram   (exit 77 = skip when numpy is missing)"""
import os, resource, signal, subprocess, sys, tempfile, time

import cli_common
from cli_common import EXE, check, cpu_seconds, failures, need_numpy, seeded_rng

np = need_numpy("numpy is not installed: skipping")
cli_common.VERBOSE = True
with open(EXE, "rb") as f:
    SANITIZED = b"__asan_init" in f.read()


def run(*args, **kw):
    return subprocess.run([EXE] + [str(a) for a in args], capture_output=True, text=True, timeout=600, **kw)


def temps(d):
    return sorted(f for f in os.listdir(d) if ".tmp." in f)


def explicit(A, B):
    """|<a_i|b_j>|^2 in complex128 from the values as given."""
    A = np.asarray(A, dtype=np.complex128)
    B = np.asarray(B, dtype=np.complex128)
    return np.abs(A.conj() @ B.T) ** 2


def product_states(X, rot):
    """The angle map's product states in numpy: qubit k in RY(x_k)|0> = [cos, sin] (rot y) or
    RX(x_k)|0> = [cos, -i sin] (rot x) of x_k / 2, the tensor product over the features."""
    out = []
    for x in X:
        s = np.ones(1, dtype=np.complex128)
        for v in x:
            q = np.array([np.cos(v / 2), (np.sin(v / 2) if rot == "y" else -1j * np.sin(v / 2))])
            s = np.kron(s, q)
        out.append(s)
    return np.array(out)


def random_states(rng, n, d, dtype=np.complex128):
    S = rng.normal(size=(n, d)) + (1j * rng.normal(size=(n, d)) if np.iscomplexobj(np.zeros(1, dtype)) else 0)
    S /= np.linalg.norm(S, axis=1, keepdims=True)
    return S.astype(dtype)


def random_rho(rng, n, d, rank=3):
    """n density matrices: mixtures of rank random pure states with random weights."""
    out = np.zeros((n, d, d), dtype=np.complex128)
    for i in range(n):
        p = rng.uniform(0.1, 1, rank)
        p /= p.sum()
        V = random_states(rng, rank, d)
        out[i] = sum(p[k] * np.outer(V[k], V[k].conj()) for k in range(rank))
        out[i] = (out[i] + out[i].conj().T) / 2   # Hermitian to the last bit
    return out


rng, seed = seeded_rng()

with tempfile.TemporaryDirectory() as d:
    P = lambda f: os.path.join(d, f)

    # ---- the map path's K from the states the map would build (a product circuit) ----
    X = rng.uniform(0, 2 * np.pi, (40, 5))
    Y = rng.uniform(0, 2 * np.pi, (17, 5))
    np.save(P("X.npy"), X)
    np.save(P("Y.npy"), Y)
    for rot in ("y", "x"):
        SA, SB = product_states(X, rot), product_states(Y, rot)
        if rot == "y":
            SA, SB = SA.real.copy(), SB.real.copy()   # RY states are real: float64 rows
        np.save(P("SA.npy"), SA)
        np.save(P("SB.npy"), SB)
        for two in (False, True):
            extra_m = ["--y", P("Y.npy")] if two else []
            extra_s = ["--states-y", P("SB.npy")] if two else []
            rm = run("--map", "angle(rot=%s)" % rot, "--x", P("X.npy"), *extra_m, "--out", P("Km.npy"), "--device", "cpu", "--quiet")
            rs = run("--states", P("SA.npy"), *extra_s, "--out", P("Ks.npy"), "--device", "cpu")
            what = "angle(rot=%s) %s" % (rot, "K(A,B)" if two else "K(A,A)")
            check(rm.returncode == 0 and rs.returncode == 0, "%s: both exit 0: %s %s" % (what, rm.stderr, rs.stderr))
            if rm.returncode or rs.returncode:
                continue
            Km, Ks = np.load(P("Km.npy")), np.load(P("Ks.npy"))
            ref = explicit(SA, SB if two else SA)
            check(Ks.shape == ref.shape and Ks.dtype == np.float64, "%s: shape %s float64" % (what, Ks.shape))
            check(np.abs(Ks - ref).max() < 1e-12, "%s: --states K = |A B^H|^2 (%.2g)" % (what, np.abs(Ks - ref).max()))
            check(np.abs(Ks - Km).max() < 1e-12, "%s: --states K = --map K (%.2g)" % (what, np.abs(Ks - Km).max()))
            if not two:
                check(np.array_equal(Ks, Ks.T), "%s: symmetric" % what)
            check(("float64" if rot == "y" else "complex128") in rs.stdout and "done: K" in rs.stdout,
                  "%s: the data line names the dtype, the done line follows: %r" % (what, rs.stdout[-300:]))

    # ---- dtypes: complex64, float32, float16, int8; big-endian, Fortran order; mixed dtypes ----
    A = random_states(rng, 30, 16)
    B = random_states(rng, 11, 16)
    cases = [
        ("complex64", A.astype(np.complex64), None, 1e-12),
        ("float64", random_states(rng, 30, 16, np.float64), None, 1e-12),
        ("float32", random_states(rng, 30, 16, np.float32), None, 1e-12),
        ("big-endian complex128", A.astype(">c16"), None, 0),
        ("Fortran-order complex128", np.asfortranarray(A), None, 0),
        ("Fortran-order big-endian complex64", np.asfortranarray(A.astype(">c8")), None, 1e-12),
        ("complex128 A, float32 B", A, random_states(rng, 11, 16, np.float32), 1e-12),
        ("float32 A, complex64 B", random_states(rng, 30, 16, np.float32), B.astype(np.complex64), 1e-12),
    ]
    for what, SA, SB, tol in cases:
        np.save(P("a.npy"), SA)
        if SB is not None:
            np.save(P("b.npy"), SB)
        r = run("--states", P("a.npy"), *(["--states-y", P("b.npy")] if SB is not None else []), "--out", P("K.npy"),
                "--device", "cpu", "--quiet")
        check(r.returncode == 0, "%s: exit 0: %s" % (what, r.stderr.strip()))
        if r.returncode == 0:
            K = np.load(P("K.npy"))
            ref = explicit(SA, SA if SB is None else SB)
            err = np.abs(K - ref).max()
            check(err <= max(tol, 1e-12), "%s: K = |A B^H|^2 of the values as stored (%.2g)" % (what, err))
            if tol == 0:
                # read exactly: K the same bits as the native little-endian C-order file's (numpy's
                # own sum order differs from qk's by rounding: 1.3e-15 on an AVX-512 host)
                np.save(P("native.npy"), np.ascontiguousarray(SA).astype(SA.dtype.newbyteorder("=")))
                rn = run("--states", P("native.npy"), "--out", P("Kn.npy"), "--device", "cpu", "--quiet")
                check(rn.returncode == 0 and np.array_equal(K, np.load(P("Kn.npy"))),
                      "%s: K bit for bit the native C-order file's: %s" % (what, rn.stderr.strip()))
    # a big-endian or Fortran-order file gives the C-order file's K bit for bit
    np.save(P("a.npy"), A)
    run("--states", P("a.npy"), "--out", P("Kc.npy"), "--device", "cpu", "--quiet")
    for what, SA in (("big-endian", A.astype(">c16")), ("Fortran order", np.asfortranarray(A))):
        np.save(P("a2.npy"), SA)
        r = run("--states", P("a2.npy"), "--out", P("K2.npy"), "--device", "cpu", "--quiet")
        check(r.returncode == 0 and np.array_equal(np.load(P("K2.npy")), np.load(P("Kc.npy"))),
              "%s complex128: K bit for bit the C-order file's" % what)
    # density matrices in Fortran order: the C-order file's K bit for bit
    Rf = random_rho(rng, 6, 4)
    np.save(P("rc.npy"), Rf)
    np.save(P("rf.npy"), np.asfortranarray(Rf.astype(">c16")))
    rc_ = run("--states", P("rc.npy"), "--out", P("Kc.npy"), "--device", "cpu", "--quiet")
    rf_ = run("--states", P("rf.npy"), "--out", P("K2.npy"), "--device", "cpu", "--quiet")
    check(rc_.returncode == 0 and rf_.returncode == 0 and np.array_equal(np.load(P("K2.npy")), np.load(P("Kc.npy"))),
          "Fortran-order big-endian density matrices: K bit for bit the C-order file's: " + rf_.stderr.strip())
    # basis states as int8 and float16: K is the identity where the states are equal
    E = np.eye(8, dtype=np.int8)[[0, 3, 3, 5]]
    for what, SA in (("int8", E), ("float16", E.astype(np.float16))):
        np.save(P("a.npy"), SA)
        r = run("--states", P("a.npy"), "--out", P("K.npy"), "--device", "cpu", "--quiet")
        check(r.returncode == 0 and np.array_equal(np.load(P("K.npy")), (E @ E.T).astype(np.float64)),
              "%s basis states: K[i][j] = [e_i == e_j]: %s" % (what, r.stderr.strip()))
    # --precision fp32: a float32 K
    np.save(P("a.npy"), A)
    r = run("--states", P("a.npy"), "--out", P("K.npy"), "--device", "cpu", "--quiet", "--precision", "fp32")
    K = np.load(P("K.npy")) if r.returncode == 0 else None
    check(K is not None and K.dtype == np.float32 and np.abs(K - explicit(A, A)).max() < 1e-6,
          "--precision fp32: K float32, within 1e-6")

    # ---- the GPU engine, where one is present (the GPU machine runs this suite) ----
    r = run("--states", P("a.npy"), "--out", P("Kg.npy"), "--device", "cuda", "--precision", "fp64", "--quiet")
    no_gpu = "no CUDA engine" in r.stderr or "no CUDA device" in r.stderr
    check(r.returncode == 0 or no_gpu, "GPU --states: failed for another reason than a missing GPU: " + r.stderr.strip()[-300:])
    if r.returncode != 0:
        print("skip: --states on the GPU engine (no CUDA device): " + r.stderr.strip()[-200:])
    else:
        print("GPU engine: --states checked on the device")
        check(np.abs(np.load(P("Kg.npy")) - explicit(A, A)).max() < 1e-12, "GPU --states fp64: K = |A A^H|^2 within 1e-12")
        np.save(P("b.npy"), B)
        for prec, tol in (("fp32", 1e-5), ("auto", 1e-5)):
            r = run("--states", P("a.npy"), "--states-y", P("b.npy"), "--out", P("Kg.npy"), "--device", "cuda", "--precision", prec)
            check(r.returncode == 0 and np.abs(np.load(P("Kg.npy")) - explicit(A, B)).max() < tol,
                  "GPU --states K(A,B) --precision %s: within %g: %s" % (prec, tol, r.stderr.strip()))

    # ---- density matrices: Tr(rho sigma) ----
    R = random_rho(rng, 12, 8)
    S = random_rho(rng, 7, 8)
    Vp = random_states(rng, 5, 8)
    np.save(P("R.npy"), R)
    np.save(P("S.npy"), S)
    np.save(P("V.npy"), Vp)
    tr = lambda a, b: np.einsum("iab,jba->ij", a, b).real
    for what, args, ref in (("K(R, R)", ["--states", P("R.npy")], tr(R, R)),
                            ("K(R, S)", ["--states", P("R.npy"), "--states-y", P("S.npy")], tr(R, S)),
                            ("K(psi, S) (pure against mixed)", ["--states", P("V.npy"), "--states-y", P("S.npy")],
                             np.einsum("ia,jab,ib->ij", Vp.conj(), S, Vp).real),
                            ("K(R, psi) (mixed against pure)", ["--states", P("R.npy"), "--states-y", P("V.npy")],
                             np.einsum("jb,iab,ja->ij", Vp, R, Vp.conj()).real)):
        r = run(*args, "--out", P("K.npy"), "--device", "cpu")   # fp64 (auto may take a GPU's fp32)
        check(r.returncode == 0, "%s: exit 0: %s" % (what, r.stderr.strip()))
        if r.returncode == 0:
            K = np.load(P("K.npy"))
            check(K.shape == ref.shape and np.abs(K - ref).max() < 1e-12,
                  "density matrices %s = Tr(rho sigma) (%.2g)" % (what, np.abs(K - ref).max() if K.shape == ref.shape else -1))
            check("Tr(rho_i rho_j)" in r.stdout, "%s: the output says K is Tr(rho_i rho_j)" % what)
    check((np.diag(tr(R, R)) < 0.95).all(), "the test's mixtures are not pure (purity < 0.95)")
    # on the GPU engine (docs/states.md, "Density matrices on the GPU engine"), where one is present
    r = run("--states", P("R.npy"), "--out", P("Kg.npy"), "--device", "cuda", "--precision", "fp64", "--quiet")
    if no_gpu:
        check(r.returncode != 0 and ("no CUDA engine" in r.stderr or "no CUDA device" in r.stderr),
              "density matrices with --device cuda and no GPU: refused for the missing GPU: %s" % r.stderr.strip())
    else:
        check(r.returncode == 0 and np.abs(np.load(P("Kg.npy")) - tr(R, R)).max() < 1e-12,
              "density matrices on the GPU engine, fp64: K = Tr(rho sigma) within 1e-12: %s" % r.stderr.strip())
    # a trace off 1: refused, then scaled by --normalize
    R2 = R.copy()
    R2[4] *= 1.5
    np.save(P("R2.npy"), R2)
    r = run("--states", P("R2.npy"), "--out", P("K.npy"))
    check(r.returncode == 1 and "A[4]" in r.stderr and "trace" in r.stderr, "rho with trace 1.5: exit 1 naming A[4]: " + r.stderr.strip())
    r = run("--states", P("R2.npy"), "--out", P("K.npy"), "--normalize", "--quiet", "--device", "cpu")
    check(r.returncode == 0 and np.abs(np.load(P("K.npy")) - tr(R, R)).max() < 1e-12, "rho with trace 1.5, --normalize: K = Tr(rho sigma)")
    R2 = R.copy()
    R2[2, 0, 1] += 0.01
    np.save(P("R2.npy"), R2)
    r = run("--states", P("R2.npy"), "--out", P("K.npy"))
    check(r.returncode == 1 and "A[2]" in r.stderr and "Hermitian" in r.stderr, "non-Hermitian rho: exit 1 naming A[2]: " + r.stderr.strip())

    # ---- validation: exit 1, the place named, nothing written, a previous K.npy untouched ----
    OLD = b"the previous K"
    def bad(what, args, code, needles):
        with open(P("K.npy"), "wb") as f:
            f.write(OLD)
        r = run(*args, "--out", P("K.npy"), "--device", "cpu")
        ok = r.returncode == code and all(n in r.stderr for n in needles)
        check(ok, "%s: exit %d, the message has %s: rc %d %r" % (what, code, needles, r.returncode, r.stderr.strip()))
        check(open(P("K.npy"), "rb").read() == OLD and temps(d) == [], "%s: K.npy untouched, no temporary" % what)
        check(len(r.stderr) < 4096 and all(32 <= ord(c) < 127 or c == "\n" for c in r.stderr), "%s: the message is printable ASCII" % what)
    Sb = A.copy()
    Sb[3] *= 1.001
    np.save(P("bad.npy"), Sb)
    bad("norm off 1 in row 3", ["--states", P("bad.npy")], 1, ["A[3]", "squared norm", "norm_tol", "bad.npy"])
    bad("norm off 1 in row 3 of B", ["--states", P("a.npy"), "--states-y", P("bad.npy")], 1, ["B[3]", "squared norm"])
    r = run("--states", P("bad.npy"), "--out", P("K.npy"), "--device", "cpu", "--norm-tol", "0.01", "--quiet")
    check(r.returncode == 0 and np.abs(np.load(P("K.npy")) - explicit(Sb, Sb)).max() < 1e-12, "--norm-tol 0.01 accepts the row, K of the values as given")
    r = run("--states", P("bad.npy"), "--out", P("K.npy"), "--device", "cpu", "--normalize", "--quiet")
    Sn = Sb / np.linalg.norm(Sb, axis=1, keepdims=True)
    check(r.returncode == 0 and np.abs(np.load(P("K.npy")) - explicit(Sn, Sn)).max() < 1e-12, "--normalize: K of the normalised states")
    Sb = A.copy()
    Sb[2, 5] = np.nan
    np.save(P("bad.npy"), Sb)
    bad("NaN at A[2][5]", ["--states", P("bad.npy")], 1, ["A[2]", "amplitude 5", "NaN"])
    Sb[2, 5] = np.inf
    np.save(P("bad.npy"), Sb)
    bad("Inf at A[2][5]", ["--states", P("bad.npy")], 1, ["A[2]", "Inf"])
    Sb = A.copy()
    Sb[7] = 0
    np.save(P("bad.npy"), Sb)
    bad("zero state, --normalize", ["--states", P("bad.npy"), "--normalize"], 1, ["A[7]", "zero state"])
    np.save(P("bad.npy"), A[0])
    bad("1-D states", ["--states", P("bad.npy")], 1, ["bad.npy", "(16,)", "2-D (n_states, dim)", "reshape(1, -1)"])
    np.save(P("bad.npy"), np.zeros((2, 2, 2, 2), dtype=np.complex128))
    bad("4-D states", ["--states", P("bad.npy")], 1, ["bad.npy", "(4 dimensions)"])
    np.save(P("bad.npy"), np.zeros((2, 4, 3), dtype=np.complex128))
    bad("non-square density matrices", ["--states", P("bad.npy")], 1, ["(2, 4, 3)", "square"])
    np.save(P("bad.npy"), np.zeros((0, 4), dtype=np.complex128))
    bad("no states", ["--states", P("bad.npy")], 1, ["(0, 4)", "at least one state"])
    np.save(P("bad.npy"), np.ones((3, 1), dtype=np.complex128))
    bad("dim 1", ["--states", P("bad.npy")], 1, ["(3, 1)", "dim >= 2"])
    np.save(P("b8.npy"), random_states(rng, 4, 8))
    bad("dims differ", ["--states", P("a.npy"), "--states-y", P("b8.npy")], 1, ["dim 16", "dim 8", "b8.npy"])
    np.save(P("bad.npy"), np.array([["ab", "cd"]]))
    bad("string dtype", ["--states", P("bad.npy")], 1, ["'<U2'", "not supported for states"])
    np.save(P("bad.npy"), np.zeros((2, 4), dtype=np.clongdouble))
    bad("long double complex", ["--states", P("bad.npy")], 1, ["long double"])
    np.save(P("bad.npy"), A)
    with open(P("bad.npy"), "r+b") as f:   # the header says (30, 16), the data is cut
        f.truncate(os.path.getsize(P("bad.npy")) - 16)
    bad("truncated data", ["--states", P("bad.npy")], 1, ["truncated data", "(30, 16)"])
    with open(P("huge.npy"), "wb") as f:   # a 200-byte file that claims 1e12 states: no allocation
        h = b"{'descr': '<c16', 'fortran_order': False, 'shape': (1000000000000, 1024), }"
        h += b" " * (118 - len(h)) + b"\n"
        f.write(b"\x93NUMPY\x01\x00" + bytes([len(h), 0]) + h + b"\0" * 64)
    bad("header claims 16 PB", ["--states", P("huge.npy")], 1, ["truncated data", "huge.npy"])
    bad("a missing file", ["--states", P("none.npy")], 1, ["none.npy", "No such file"])
    np.savetxt(P("s.csv"), A.real, delimiter=",")
    bad("--states from .csv", ["--states", P("s.csv")], 1, ["s.csv", ".npy"])

    # ---- command-line errors: exit 2 ----
    for what, args, needle in (
            ("--states with --map", ["--states", P("a.npy"), "--map", "zz", "--out", P("K.npy")], "--states and --map exclude each other"),
            ("--states with --x", ["--states", P("a.npy"), "--x", P("X.npy"), "--out", P("K.npy")], "--states and --x exclude each other"),
            ("--states with --y", ["--states", P("a.npy"), "--y", P("X.npy"), "--out", P("K.npy")], "--states-y"),
            ("--states-y alone", ["--states-y", P("a.npy"), "--out", P("K.npy")], "--states-y needs --states"),
            ("--states with --weights", ["--states", P("a.npy"), "--weights", P("X.npy"), "--out", P("K.npy")], "--weights goes with --map"),
            ("--states with --path mps", ["--states", P("a.npy"), "--path", "mps", "--out", P("K.npy")], "statevector path"),
            ("--normalize without --states", ["--map", "zz", "--x", P("X.npy"), "--out", P("K.npy"), "--normalize"], "--normalize goes with --states"),
            ("--norm-tol without --states", ["--map", "zz", "--x", P("X.npy"), "--out", P("K.npy"), "--norm-tol", "1e-3"], "--norm-tol goes with --states"),
            ("--norm-tol 1", ["--states", P("a.npy"), "--out", P("K.npy"), "--norm-tol", "1"], "expected a number in (0, 1)"),
            ("--norm-tol abc", ["--states", P("a.npy"), "--out", P("K.npy"), "--norm-tol", "abc"], "expected a number in (0, 1)"),
            ("--states twice", ["--states", P("a.npy"), "--states", P("a.npy"), "--out", P("K.npy")], "given twice"),
            ("--states without --out", ["--states", P("a.npy")], "--out is required"),
            ("--out is --states", ["--states", P("a.npy"), "--out", P("a.npy")], "the output would overwrite the input"),
            ("--out is --states-y", ["--states", P("a.npy"), "--states-y", P("b8.npy"), "--out", P("b8.npy")], "--states-y"),
            ("--demo with --states", ["--demo", "--states", P("a.npy")], "--demo takes no --states")):
        r = run(*args)
        check(r.returncode == 2 and needle in r.stderr, "%s: exit 2, '%s': rc %d %r" % (what, needle, r.returncode, r.stderr.strip()))
    check(os.path.exists(P("a.npy")) and np.array_equal(np.load(P("a.npy")), A), "the input named as --out is untouched")
    r = run("--help")
    check(r.returncode == 0 and "--states FILE" in r.stdout and "--norm-tol" in r.stdout, "--help lists --states, --norm-tol")

    # ---- a write past ulimit -f: exit 1, the limit named, no temporary, the old K untouched ----
    np.save(P("s300.npy"), random_states(rng, 300, 8))
    with open(P("K.npy"), "wb") as f:
        f.write(OLD)
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    r = run("--states", P("s300.npy"), "--out", P("K.npy"), "--device", "cpu", "--quiet", preexec_fn=limit)
    check(r.returncode == 1 and "file size limit" in r.stderr and "102400" in r.stderr,
          "--states past ulimit -f: exit 1 naming the limit (-25 / 153: killed by SIGXFSZ): rc %d %r" % (r.returncode, r.stderr.strip()))
    check(temps(d) == [] and open(P("K.npy"), "rb").read() == OLD, "--states past ulimit -f: no temporary, the old K untouched")
    os.remove(P("K.npy"))

    # ---- SIGINT / SIGTERM during a long --states job: K(A, A) of 6000 states of dim 4096
    # (complex128, 393 MB; ~7e10 complex multiply-adds, tens of seconds on 2 cores). The signal
    # goes once the Gram runs (its temporary file exists) and the job has had 1 s of CPU time; the
    # stop is measured in CPU time (2 threads: at most ~2 s of CPU for a 1 s stop), which a loaded
    # machine does not stretch, with a generous wall-clock bound besides. ----
    N, D = (800, 1024) if SANITIZED else (6000, 4096)
    big = np.empty((N, D), dtype=np.complex128)
    for i0 in range(0, N, 500):
        blk = rng.normal(size=(min(500, N - i0), D)) + 1j * rng.normal(size=(min(500, N - i0), D))
        big[i0:i0 + len(blk)] = blk / np.linalg.norm(blk, axis=1, keepdims=True)
    np.save(P("big.npy"), big)
    del big
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        with open(P("K.npy"), "wb") as f:
            f.write(OLD)
        p = subprocess.Popen([EXE, "--states", P("big.npy"), "--out", P("K.npy"), "--device", "cpu", "--threads", "2",
                              "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t_start, cpu0, running = time.perf_counter(), 0.0, False
        while p.poll() is None and time.perf_counter() - t_start < 300:
            try:
                cpu0 = cpu_seconds(p.pid)
            except (OSError, IndexError):
                break
            if temps(d) and cpu0 >= 1.0:
                running = True
                break
            time.sleep(0.05)
        if not running:
            p.kill()
            out, err = p.communicate()
            check(False, "%s: the Gram was not running when the signal was due (rc %s, temporaries %s): %s"
                  % (sig.name, p.returncode, temps(d), err.strip()))
            continue
        t0 = time.perf_counter()
        os.kill(p.pid, sig)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        cpu_after = ru.ru_utime + ru.ru_stime - cpu0
        check(p.returncode == code, "%s: exit %d (got %s): %s" % (sig.name, code, p.returncode, err.strip()))
        if not SANITIZED:
            check(cpu_after < 2.5, "%s: stopped after %.2f s of CPU time (< 2.5 s, 2 threads) and %.2f s wall" % (sig.name, cpu_after, dt))
        check(dt < 20, "%s: stopped %.2f s after the signal (< 20 s: not the whole job)" % (sig.name, dt))
        check(temps(d) == [], "%s: no temporary file left (%s)" % (sig.name, temps(d)))
        check(open(P("K.npy"), "rb").read() == OLD, "%s: the previous K.npy is untouched" % sig.name)
        check("was not written" in err and "(%s)" % sig.name in err, "%s: the stop is reported: %r" % (sig.name, err))

    # ---- SIGHUP as soon as the states file is open (while it is read, before any output
    # exists, where the timing allows: the handler exits at once; later, the run stops at its
    # next poll): exit 129 either way, the stop reported, no temporary ----
    with open(P("K.npy"), "wb") as f:
        f.write(OLD)
    p = subprocess.Popen([EXE, "--states", P("big.npy"), "--out", P("K.npy"), "--device", "cpu", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t_start, seen = time.perf_counter(), False
    while p.poll() is None and not seen and time.perf_counter() - t_start < 60:
        try:
            seen = any(os.readlink("/proc/%d/fd/%s" % (p.pid, fd)).endswith("big.npy") for fd in os.listdir("/proc/%d/fd" % p.pid))
        except OSError:
            pass
    p.send_signal(signal.SIGHUP)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    print("SIGHUP sent %s the states file was seen open" % ("after" if seen else "before"))
    check(p.returncode == 129, "SIGHUP while the states are read: exit 129 (got %s): %s" % (p.returncode, err.strip()))
    check("hung up (SIGHUP)" in err and "was not written" in err, "SIGHUP while the states are read: the stop is reported: %r" % err)
    check(temps(d) == [] and open(P("K.npy"), "rb").read() == OLD, "SIGHUP while the states are read: no temporary, K.npy untouched")

if failures:
    print("%d check(s) failed (seed %d)" % (len(failures), seed))
    sys.exit(1)
print("all --states checks passed")
