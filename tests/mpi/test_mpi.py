#!/usr/bin/env python3
"""qk_gram_mpi and qk-gram-mpi under mpirun -n 1, 2, 3 (CPU engine, oversubscribed).

usage: test_mpi.py --mpirun MPIRUN --test TEST_MPI --qk-gram QK_GRAM --qk-gram-mpi QK_GRAM_MPI --dir DIR
       test_mpi.py --skip REASON          (exit 77: meson reports a skip)
       --quick: the library test on 2 and 3 ranks only (sanitizer builds)

- tests/mpi/test_mpi.c (the library entry point) on 1, 2 and 3 ranks: bitwise K, tiles, failures;
- qk-gram-mpi against qk-gram on the same inputs (odd sizes; K(X,X) and K(X,Y); complex, real
  and float32): the two .npy files are byte for byte the same;
- qk-gram-mpi --states (and --states-y, --normalize) against qk-gram --states: byte for byte the
  same .npy; NaN in a state: exit 1 on every rank, one message naming the row, no file left;
- qk-gram-mpi's errors: a missing output directory, NaN in X, a bad command line: exit 1 / 2 on
  every rank, one message, no file left;
- one rank stopped: SIGTERM to one rank stops the whole job within seconds, a SIGKILLed rank
  leaves no temporary file, the previous K is left as it was; stale temporaries of dead
  processes are removed by the next run, a live process's kept.
Needs no numpy: inputs are written as CSV, outputs compared as bytes.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env, oversubscribe  # noqa: E402  (tests/mpi is not a package)

ap = argparse.ArgumentParser()
ap.add_argument("--skip")
ap.add_argument("--mpirun")
ap.add_argument("--test")
ap.add_argument("--qk-gram")
ap.add_argument("--qk-gram-mpi")
ap.add_argument("--dir")
ap.add_argument("--quick", action="store_true",
                help="the library test on 2 and 3 ranks only (sanitizer builds: every mpirun costs seconds there)")
args = ap.parse_args()
if args.skip:
    print("skipping the MPI tests:", args.skip)
    sys.exit(77)

env = mpi_env()
try:
    ver = subprocess.run([args.mpirun, "--version"], capture_output=True, text=True, timeout=60, env=env)
    ver = ver.stdout + ver.stderr
except (OSError, subprocess.TimeoutExpired) as e:
    print("skipping the MPI tests: %s --version failed: %s" % (args.mpirun, e))
    sys.exit(77)
extra = oversubscribe(ver)
print("mpirun:", ver.strip().splitlines()[0] if ver.strip() else "?", extra)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def mpirun(n, cmd, timeout=180):
    p = subprocess.run([args.mpirun, "-n", str(n)] + extra + cmd, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


# MPI must be able to start at all here; if not, this machine cannot run the tests
rc, out, err = mpirun(1, [args.test, "--probe"], timeout=120)
if rc != 0:
    print(out, err)
    print("skipping the MPI tests: mpirun cannot start a process here (see above)")
    sys.exit(77)

root = os.path.abspath(args.dir)
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)

# ---- the library entry point ----
# serialized: slabs written by a second thread while the next is computed; single: inline
runs = ((1, "serialized"), (2, "serialized"), (3, "serialized"), (2, "single"), (3, "single"))
if args.quick:
    runs = ((2, "serialized"), (3, "single"))
for n, level in runs:
    d = os.path.join(root, "lib%d-%s" % (n, level))
    os.makedirs(d)
    rc, out, err = mpirun(n, [args.test, d, level])
    sys.stdout.write(out)
    if rc != 0:
        sys.stdout.write(err)
    check(rc == 0, "test_mpi on %d ranks (%s) exited %d" % (n, level, rc))
    if level != "single" and "writer thread off" in out:
        print("note: this MPI gives no MPI_THREAD_SERIALIZED: the writer thread is not tested")


if args.quick:
    if failures:
        print("%d failure(s)" % len(failures))
        sys.exit(1)
    shutil.rmtree(root, ignore_errors=True)
    print("ok (quick: qk-gram-mpi not run)")
    sys.exit(0)

# ---- qk-gram-mpi against qk-gram ----
def write_csv(path, rows, cols, seed, nan_at=None):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(rows):
            vals = ["%.17g" % rnd.uniform(0.0, 3.14159) for _ in range(cols)]
            if nan_at == i:
                vals[cols - 1] = "nan"
            f.write(",".join(vals) + "\n")


def read(path):
    with open(path, "rb") as f:
        return f.read()


cli = os.path.join(root, "cli")
os.makedirs(cli)
write_csv(os.path.join(cli, "X.csv"), 45, 3, 1)
write_csv(os.path.join(cli, "Y.csv"), 29, 3, 2)
write_csv(os.path.join(cli, "X4.csv"), 37, 4, 3)
cases = [
    ("zz-xx", ["--map", "zz(reps=2)", "--x", "X.csv"]),
    ("iqp-xy-f32", ["--map", "iqp", "--x", "X.csv", "--y", "Y.csv", "--precision", "fp32"]),
    ("hea-xx", ["--map", "hea(layers=2)", "--x", "X4.csv"]),
]
for name, opts in cases:
    opts = [o if not o.endswith(".csv") else os.path.join(cli, o) for o in opts]
    ref = os.path.join(cli, name + "-ref.npy")
    p = subprocess.run([args.qk_gram] + opts + ["--out", ref, "--device", "cpu", "--threads", "1", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "qk-gram %s exited %d: %s" % (name, p.returncode, p.stderr))
    for n in (1, 2, 3):
        out = os.path.join(cli, "%s-%d.npy" % (name, n))
        rc, o, e = mpirun(n, [args.qk_gram_mpi] + opts + ["--out", out, "--quiet", "--no-sync"])
        check(rc == 0, "qk-gram-mpi %s on %d ranks exited %d: %s" % (name, n, rc, e))
        if rc == 0 and p.returncode == 0:
            check(read(out) == read(ref), "qk-gram-mpi %s on %d ranks: K.npy differs from qk-gram's" % (name, n))
# the default output: a summary on rank 0 only
rc, o, e = mpirun(2, [args.qk_gram_mpi, "--map", "zz", "--x", os.path.join(cli, "X.csv"), "--out",
                      os.path.join(cli, "summary.npy")])
check(rc == 0 and o.count("done: K 45 x 45 (float64)") == 1 and "on 2 ranks" in o,
      "qk-gram-mpi summary: exit %d, output:\n%s%s" % (rc, o, e))
leftover = sorted(f for f in os.listdir(cli) if ".tmp." in f)
check(not leftover, "temporary files left: %s" % leftover)

# ---- qk-gram-mpi --states against qk-gram --states ----
def write_states(path, n, dim, seed, dtype="<c16", nan_at=None):
    """n random unit states of dim amplitudes as a .npy (complex128 or float32), no numpy"""
    import math
    import struct
    rnd = random.Random(seed)
    cplx = dtype == "<c16"
    vals = []
    for i in range(n):
        v = [rnd.uniform(-1.0, 1.0) for _ in range(2 * dim if cplx else dim)]
        s = math.sqrt(sum(t * t for t in v))
        v = [t / s for t in v]
        if nan_at == i:
            v[1] = float("nan")
        vals += v
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }" % (dtype, n, dim)
    hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%d%s" % (len(vals), "d" if cplx else "f"), *vals))


sdir = os.path.join(root, "states")
os.makedirs(sdir)
write_states(os.path.join(sdir, "A.npy"), 41, 16, 5)
write_states(os.path.join(sdir, "B.npy"), 23, 16, 6, dtype="<f4")   # widened to complex128, float tolerance
write_states(os.path.join(sdir, "Abad.npy"), 30, 8, 7, nan_at=17)
for name, opts in (("aa", ["--states", "A.npy"]), ("ab", ["--states", "A.npy", "--states-y", "B.npy"]),
                   ("aa-norm", ["--states", "A.npy", "--normalize"])):
    opts = [o if not o.endswith(".npy") else os.path.join(sdir, o) for o in opts]
    ref = os.path.join(sdir, name + "-ref.npy")
    p = subprocess.run([args.qk_gram] + opts + ["--out", ref, "--device", "cpu", "--threads", "1", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "qk-gram --states %s exited %d: %s" % (name, p.returncode, p.stderr))
    for n in (1, 2, 3):
        out = os.path.join(sdir, "%s-%d.npy" % (name, n))
        rc, o, e = mpirun(n, [args.qk_gram_mpi] + opts + ["--out", out, "--quiet", "--no-sync"])
        check(rc == 0, "qk-gram-mpi --states %s on %d ranks exited %d: %s" % (name, n, rc, e))
        if rc == 0 and p.returncode == 0:
            check(read(out) == read(ref), "qk-gram-mpi --states %s on %d ranks: K.npy differs from qk-gram's" % (name, n))
# ---- qk-gram-mpi --states read row by row (each rank opens the files, reads its rows) ----
def write_npy(path, descr, shape, vals, fortran=False, truncate=0):
    """a .npy of the row-major values vals (complex as (re, im) pairs) in dtype descr ('<c16',
    '>c16', '<c8', '<f8', '<f4'), Fortran order if asked (the same array), truncate bytes cut off"""
    import struct
    cplx = descr[1] == "c"
    size = int(descr[2:]) // (2 if cplx else 1)
    ch = "d" if size == 8 else "f"
    items = [vals[2 * k:2 * k + 2] for k in range(len(vals) // 2)] if cplx else [[v] for v in vals]
    if fortran:   # the same array stored column-major: item (i, j[, k]) at i + n (j + d k)
        idx = []
        dims = list(shape)
        for flat in range(len(items)):
            rest, sub = flat, []
            for d in dims:
                sub.append(rest % d)
                rest //= d
            c = 0
            for d, t in zip(dims, sub):
                c = c * d + t
            idx.append(c)
        items = [items[c] for c in idx]
    hdr = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, "True" if fortran else "False",
                                                                     ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
    data = b"".join(struct.pack(descr[0] + ch * len(t), *t) for t in items)
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(data[:len(data) - truncate])


def unit_states(n, dim, seed, cplx):
    import math
    rnd = random.Random(seed)
    vals = []
    for _ in range(n):
        v = [rnd.uniform(-1.0, 1.0) for _ in range(2 * dim if cplx else dim)]
        s = math.sqrt(sum(t * t for t in v))
        vals += [t / s for t in v]
    return vals


def density(n, dim, seed, cplx):
    """n density matrices 0.75 |u><u| + 0.25 |v><v| (trace 1, Hermitian), row-major"""
    vals = []
    for i in range(n):
        u = unit_states(2, dim, seed * 1000 + i, cplx)
        vecs = [[complex(u[o + 2 * k], u[o + 2 * k + 1]) if cplx else u[o + k] for k in range(dim)] for o in (0, 2 * dim if cplx else dim)]
        for a in range(dim):
            for b in range(dim):
                z = sum(w * x[a] * (x[b].conjugate() if cplx else x[b]) for w, x in zip((0.75, 0.25), vecs))
                vals += [z.real, z.imag] if cplx else [z]
    return vals


def reads(err):
    """each rank's line of QK_GRAM_MPI_TEST_READS: rank -> (path, A rows, A bytes, B rows, B bytes)"""
    got = {}
    for m in re.finditer(r"test reads: rank (\d+) of \d+: (\w+), A (\d+) rows (\d+) bytes, B (\d+) rows (\d+) bytes", err):
        got[int(m.group(1))] = (m.group(2),) + tuple(int(m.group(k)) for k in range(3, 7))
    return got


rdir = os.path.join(root, "rows")
os.makedirs(rdir)
NA, NB, DIM = 37, 19, 8
files = {
    "c16.npy": ("<c16", (NA, DIM), unit_states(NA, DIM, 11, True)),
    "c16be.npy": (">c16", (NA, DIM), unit_states(NA, DIM, 11, True)),        # byte-swapped on the way
    "c8.npy": ("<c8", (NA, DIM), unit_states(NA, DIM, 12, True)),
    "f8.npy": ("<f8", (NA, DIM), unit_states(NA, DIM, 13, False)),
    "f8b.npy": ("<f8", (NB, DIM), unit_states(NB, DIM, 14, False)),
    "f4b.npy": ("<f4", (NB, DIM), unit_states(NB, DIM, 15, False)),         # widened to complex128 against c16
    "c8b.npy": ("<c8", (NB, DIM), unit_states(NB, DIM, 16, True)),
    "rho.npy": ("<f8", (23, 4, 4), density(23, 4, 17, False)),
    "rhob.npy": ("<f8", (13, 4, 4), density(13, 4, 18, False)),
    "rhoc.npy": ("<c16", (23, 4, 4), density(23, 4, 19, True)),
    "psi4.npy": ("<c16", (17, 4), unit_states(17, 4, 20, True)),             # pure against mixed: broadcast
}
for name, (descr, shape, vals) in files.items():
    write_npy(os.path.join(rdir, name), descr, shape, vals)
descr, shape, vals = files["c16.npy"]
write_npy(os.path.join(rdir, "c16F.npy"), descr, shape, vals, fortran=True)   # Fortran order: broadcast
# name, A, B, the path each rank takes (rows: read row by row; broadcast: rank 0 reads, broadcasts)
rcases = [("c16-aa", "c16.npy", None, "rows"), ("c16-ab-f4", "c16.npy", "f4b.npy", "rows"),
          ("c16be-aa", "c16be.npy", None, "rows"), ("c8-aa", "c8.npy", None, "rows"),
          ("c8-ab", "c8.npy", "c8b.npy", "rows"), ("f8-aa", "f8.npy", None, "rows"),
          ("f8-ab-f4", "f8.npy", "f4b.npy", "rows"), ("rho-aa", "rho.npy", None, "rows"),
          ("rho-ab", "rho.npy", "rhob.npy", "rows"), ("rhoc-aa", "rhoc.npy", None, "rows"),
          ("fortran-aa", "c16F.npy", None, "broadcast"), ("psi-rho", "psi4.npy", "rhob.npy", "broadcast")]
renv = dict(env, QK_GRAM_MPI_TEST_READS="1")
for name, fa, fb, path in rcases:
    opts = ["--states", os.path.join(rdir, fa)] + (["--states-y", os.path.join(rdir, fb)] if fb else [])
    na = files[fa][1][0] if fa in files else NA
    ref = os.path.join(rdir, name + "-ref.npy")
    p = subprocess.run([args.qk_gram] + opts + ["--out", ref, "--device", "cpu", "--threads", "1", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "qk-gram --states %s exited %d: %s" % (name, p.returncode, p.stderr))
    for n in (1, 2, 3):
        for how, e2 in (("", renv), ("-bcast", dict(renv, QK_GRAM_MPI_TEST_BROADCAST="1"))):
            out = os.path.join(rdir, "%s-%d%s.npy" % (name, n, how))
            q = subprocess.run([args.mpirun, "-n", str(n)] + extra + [args.qk_gram_mpi] + opts + ["--out", out, "--quiet", "--no-sync"],
                               capture_output=True, text=True, timeout=180, env=e2)
            check(q.returncode == 0, "qk-gram-mpi --states %s%s on %d ranks exited %d: %s" % (name, how, n, q.returncode, q.stderr))
            if q.returncode != 0 or p.returncode != 0:
                continue
            check(read(out) == read(ref), "qk-gram-mpi --states %s%s on %d ranks: K.npy differs from qk-gram's" % (name, how, n))
            got = reads(q.stderr)
            want_path = "broadcast" if how else path
            check(sorted(got) == list(range(n)) and all(v[0] == want_path for v in got.values()),
                  "qk-gram-mpi --states %s%s on %d ranks: the ranks' reads %s, want the %s path on each" % (name, how, n, got, want_path))
            if want_path != "rows" or sorted(got) != list(range(n)):
                continue
            # what the ranks read: each A row once over all ranks for K(A,B) (a band each), the last
            # rank's band and what lies past it for K(A,A); never all of A on every rank when
            # n > 1; bytes = rows x a state's bytes in the file
            a_rows = [got[k][1] for k in range(n)]
            fd = files[fa]
            row_bytes = (int(fd[0][2:])) * (fd[1][1] * (fd[1][2] if len(fd[1]) == 3 else 1))
            check(all(got[k][2] == got[k][1] * row_bytes for k in range(n)),
                  "qk-gram-mpi --states %s on %d ranks: bytes read are not rows x %d: %s" % (name, n, row_bytes, got))
            if fb:
                check(sum(a_rows) == na, "qk-gram-mpi --states %s on %d ranks: A rows read %s, want %d in all (each row once)" % (name, n, a_rows, na))
            else:
                check(sum(a_rows) < n * na or n == 1, "qk-gram-mpi --states %s on %d ranks: A rows read %s: every rank read all %d" % (name, n, a_rows, na))
                check(a_rows[0] == na, "qk-gram-mpi --states %s on %d ranks: rank 0 read %d rows of A, want all %d (its band's columns)" % (name, n, a_rows[0], na))
            if n > 1:
                check(a_rows[n - 1] < na, "qk-gram-mpi --states %s on %d ranks: the last rank read all %d rows of A" % (name, n, na))

# a file shorter than its header says, and one longer: exit 1 on every rank, one message, the old K.npy kept
descr, shape, vals = files["c16.npy"]
write_npy(os.path.join(rdir, "short.npy"), descr, shape, vals, truncate=24)
for n in (1, 3):
    out = os.path.join(rdir, "old.npy")
    with open(out, "wb") as f:
        f.write(b"old content\n")
    rc, o, e = mpirun(n, [args.qk_gram_mpi, "--states", os.path.join(rdir, "c16.npy"), "--states-y", os.path.join(rdir, "short.npy"),
                          "--out", out, "--quiet"], timeout=120)
    check(rc == 1 and e.count("error:") == 1 and "truncated data" in e,
          "qk-gram-mpi --states-y truncated file on %d ranks: exit %d (want 1), stderr:\n%s" % (n, rc, e))
    check(read(out) == b"old content\n", "qk-gram-mpi, a truncated state file: the old K.npy was changed")
check(not [f for f in os.listdir(rdir) if ".tmp." in f], "temporary files left in %s" % sorted(os.listdir(rdir)))

rc, o, e = mpirun(3, [args.qk_gram_mpi, "--states", os.path.join(sdir, "Abad.npy"), "--out", os.path.join(sdir, "bad.npy")])
check(rc == 1 and "A[17]: amplitude 0 is NaN" in e and e.count("error:") == 1,
      "qk-gram-mpi --states, NaN in A[17]: exit %d (want 1), stderr:\n%s" % (rc, e))
rc, o, e = mpirun(2, [args.qk_gram_mpi, "--states", os.path.join(sdir, "A.npy"), "--map", "zz", "--out", os.path.join(sdir, "bad.npy")])
check(rc == 2 and e.count("exclude each other") == 1, "qk-gram-mpi --states with --map: exit %d (want 2), stderr:\n%s" % (rc, e))
check(not [f for f in os.listdir(sdir) if f.startswith("bad") or ".tmp." in f], "files left after the --states errors: %s" % sorted(os.listdir(sdir)))

# ---- qk-gram-mpi errors ----
bad = os.path.join(root, "bad")
os.makedirs(bad)
write_csv(os.path.join(bad, "Xnan.csv"), 20, 3, 4, nan_at=13)
rc, o, e = mpirun(3, [args.qk_gram_mpi, "--map", "zz", "--x", os.path.join(cli, "X.csv"), "--out",
                      os.path.join(bad, "missing", "K.npy")])
check(rc == 1 and "does not exist" in e and e.count("error:") == 1,
      "missing output directory: exit %d (want 1), stderr:\n%s" % (rc, e))
rc, o, e = mpirun(3, [args.qk_gram_mpi, "--map", "zz", "--x", os.path.join(bad, "Xnan.csv"), "--out",
                      os.path.join(bad, "K.npy")])
check(rc == 1 and "X[13][2]" in e and e.count("error:") == 1, "NaN in X: exit %d (want 1), stderr:\n%s" % (rc, e))
rc, o, e = mpirun(2, [args.qk_gram_mpi, "--map", "zz", "--x", os.path.join(cli, "X.csv"), "--out",
                      os.path.join(bad, "K.npy"), "--threads", "0"])
check(rc == 2 and e.count("--threads") == 1, "bad --threads: exit %d (want 2), stderr:\n%s" % (rc, e))
check(os.listdir(bad) == ["Xnan.csv"], "files left after the errors: %s" % sorted(os.listdir(bad)))

# ---- one rank stopped: SIGTERM to one rank stops the job; a SIGKILLed rank leaves no file ----
# A job of many seconds (1400 x 12 qubits, one thread a rank: each rank's band is one block, so
# only a look for the other's failure inside the block stops it early). The ranks are found by
# their command line (the unique --out) and Open MPI's / MPICH's rank variable.
def rank_pids(out, n, timeout=60):
    t_end = time.time() + timeout
    while time.time() < t_end:
        found = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    cmd = f.read().split(b"\0")
                if os.path.basename(cmd[0]) != b"qk-gram-mpi" or out.encode() not in cmd:
                    continue
                with open("/proc/%s/environ" % d, "rb") as f:
                    envs = f.read().split(b"\0")
            except OSError:
                continue
            for e in envs:
                if e.startswith(b"OMPI_COMM_WORLD_RANK=") or e.startswith(b"PMI_RANK="):
                    found[int(e.split(b"=")[1])] = int(d)
        if len(found) == n:
            return found
        time.sleep(0.05)
    return None


stop = os.path.join(root, "stop")
os.makedirs(stop)
write_csv(os.path.join(stop, "X.csv"), 4000, 12, 5)   # a job of minutes on one thread a rank: still running when the signal comes, on a 16-core host too
if os.path.isdir("/proc/self"):
    for what, sig, victim in (("SIGTERM to rank 1", signal.SIGTERM, 1), ("SIGHUP to rank 0", signal.SIGHUP, 0),
                              ("SIGKILL to rank 1", signal.SIGKILL, 1),
                              ("SIGKILL to rank 0", signal.SIGKILL, 0)):
        out = os.path.join(stop, "K-%s-%d.npy" % (sig.name, victim))
        with open(out, "wb") as f:
            f.write(b"previous K")
        p = subprocess.Popen([args.mpirun, "-n", "2"] + extra + [args.qk_gram_mpi, "--map", "zz(reps=2)", "--x",
                             os.path.join(stop, "X.csv"), "--out", out, "--threads", "1", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        pids = rank_pids(out, 2)
        t_end = time.time() + 60   # computing: the temporary file is there
        while pids and time.time() < t_end and not [f for f in os.listdir(stop) if ".tmp." in f]:
            time.sleep(0.05)
        time.sleep(1.0)
        if pids is None or p.poll() is not None:
            p.kill()
            p.communicate()
            check(False, "%s: the ranks were not found running (pids %s, rc %s)" % (what, pids, p.returncode))
            continue
        t0 = time.time()
        os.kill(pids[victim], sig)
        try:
            o, e = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        dt = time.time() - t0
        print("%s: mpirun exited %s after %.2f s" % (what, p.returncode, dt))
        check(p.returncode != 0, "%s: mpirun exits non-zero (got %s)" % (what, p.returncode))
        if sig in (signal.SIGTERM, signal.SIGHUP):
            check(dt < 8.0, "%s: the whole job stops within seconds (took %.1f s)" % (what, dt))
            check("stopped by %s" % sig.name in e, "%s: the stop is reported: %s" % (what, e[-2000:]))
        left = [f for f in os.listdir(stop) if ".tmp." in f]
        check(not left, "%s: no temporary file left after mpirun exits: %s" % (what, left))
        with open(out, "rb") as f:
            check(f.read() == b"previous K", "%s: the previous K is left as it was" % what)
        for f in left:
            os.remove(os.path.join(stop, f))

    # stale temporaries: rank 0's run removes a dead process's (of this host), keeps a live one's
    host = re.sub(r"[^A-Za-z0-9-]", "_", os.uname().nodename)[:40]
    q = subprocess.Popen(["true"])
    q.wait()
    sleeper = subprocess.Popen(["sleep", "120"])
    out = os.path.join(stop, "K-stale.npy")
    dead_tmp = "K-stale.npy.tmp.%d.0.%s" % (q.pid, host)
    live_tmp = "K-stale.npy.tmp.%d.0.%s" % (sleeper.pid, host)
    for f in (dead_tmp, live_tmp):
        with open(os.path.join(stop, f), "wb") as fh:
            fh.write(b"partial")
    rc, o, e = mpirun(2, [args.qk_gram_mpi, "--map", "zz", "--x", os.path.join(cli, "X.csv"), "--out", out, "--quiet"])
    left = os.listdir(stop)
    check(rc == 0, "stale temporaries: qk-gram-mpi exited %d: %s" % (rc, e))
    check(dead_tmp not in left, "stale temporaries: a dead process's %s is removed" % dead_tmp)
    check(live_tmp in left, "stale temporaries: a live process's %s is kept" % live_tmp)
    sleeper.kill()
    sleeper.wait()
else:
    print("note: no /proc: the rank-stop and stale-temporary tests are skipped")

if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
shutil.rmtree(root, ignore_errors=True)
print("ok")
