#!/usr/bin/env python3
"""qk-gram --path mps against an independent MPS simulation written here with numpy, at 50 and 64
qubits (no statevector exists there), and the --path option's errors.

usage: test_mps_ref.py PATH/TO/qk-gram     (meson passes it; exit 77 = skip when numpy is missing)

The reference follows the circuit (Qiskit's ZZFeatureMap, ent=linear or circular) gate by gate,
TEBD style: one-qubit gates on site tensors; each entangling block CX(i,j) P(t)_j CX(i,j) as the
two-qubit diagonal gate diag(1, e^{it}, e^{it}, 1); neighbouring sites are contracted, the gate
applied, and split by numpy's SVD keeping every singular value above 1e-13 of the largest (no
truncation of the state). Non-neighbouring pairs (the circular wrap) are brought together by SWAP
gates along the chain and moved back. Overlaps by contracting the two chains. Nothing here is
shared with qk's MPS engine (no bound, no QR, no ordering, no lane layout). Tolerance 1e-10.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from cli_common import EXE, check, failures, need_numpy, seeded_rng  # noqa: E402  (tests/cli)

np = need_numpy("numpy is not installed: skipping the MPS reference tests")


H = np.array([[1, 1], [1, -1]]) / np.sqrt(2)
SWAP = np.eye(4)[[0, 2, 1, 3]].reshape(2, 2, 2, 2)


def phase(t):
    return np.diag([1, np.exp(1j * t)])


def two_site(mps, i, g):
    """g[a', b', a, b] on sites i, i+1; exact split by SVD."""
    A, B = mps[i], mps[i + 1]
    th = np.einsum("lar,rbs->labs", A, B)
    th = np.einsum("xyab,labs->lxys", g, th)
    l, _, _, s = th.shape
    u, sv, vh = np.linalg.svd(th.reshape(l * 2, 2 * s), full_matrices=False)
    k = max(1, int(np.sum(sv > 1e-13 * sv[0])))
    mps[i] = u[:, :k].reshape(l, 2, k)
    mps[i + 1] = (sv[:k, None] * vh[:k]).reshape(k, 2, s)


def zz_mps(x, reps, pairs):
    q = len(x)
    mps = [np.array([1.0, 0.0], dtype=complex).reshape(1, 2, 1) for _ in range(q)]
    for _ in range(reps):
        for k in range(q):
            u = phase(2 * x[k]) @ H
            mps[k] = np.einsum("ab,lbr->lar", u, mps[k])
        for (i, j) in pairs:
            t = 2 * (np.pi - x[i]) * (np.pi - x[j])
            d = np.diag([1, np.exp(1j * t), np.exp(1j * t), 1]).reshape(2, 2, 2, 2)
            a, b = min(i, j), max(i, j)
            for s in range(b - 1, a, -1):     # bring qubit b next to a
                two_site(mps, s, SWAP)
            two_site(mps, a, d)
            for s in range(a + 1, b):         # and back
                two_site(mps, s, SWAP)
    return mps


def overlap(m1, m2):
    e = np.ones((1, 1), dtype=complex)
    for A, B in zip(m1, m2):
        e = np.einsum("lm,lar,mas->rs", e, A.conj(), B)
    return abs(e[0, 0]) ** 2


def run(*args):
    return subprocess.run([EXE, *args, "--device", "cpu"], capture_output=True, text=True, timeout=120)


rng, seed = seeded_rng()

with tempfile.TemporaryDirectory(prefix="qk-test-mps-") as d:
    P = lambda name: os.path.join(d, name)
    for q, ent, reps, n in ((50, "linear", 2, 6), (64, "circular", 1, 5), (50, "linear", 3, 4)):
        X = rng.uniform(0, np.pi, (n, q))
        np.save(P("X.npy"), X)
        pairs = [(k, k + 1) for k in range(q - 1)]
        if ent == "circular":
            pairs = [(q - 1, 0)] + pairs
        ref = [zz_mps(x, reps, pairs) for x in X]
        K_ref = np.array([[overlap(a, b) for b in ref] for a in ref])
        spec = "zz(reps=%d,ent=%s)" % (reps, ent)
        for path in ("mps", "auto"):
            r = run("--map", spec, "--x", P("X.npy"), "--out", P("K.npy"), "--path", path)
            check(r.returncode == 0 and "path mps" in r.stdout, "%s q=%d --path %s: %s" % (spec, q, path, r.stderr))
            if r.returncode == 0:
                K = np.load(P("K.npy"))
                err = np.abs(K - K_ref).max()
                check(err <= 1e-10, "%s q=%d --path %s: |K - numpy MPS| = %.3g" % (spec, q, path, err))
        print("%s q=%d n=%d: checked against the numpy MPS" % (spec, q, n))

    # --path errors: forced statevector beyond 30 qubits, forced MPS on a non-local map, bad value
    np.save(P("X8.npy"), rng.uniform(0, np.pi, (4, 40)))
    r = run("--map", "zz(ent=linear)", "--x", P("X8.npy"), "--out", P("bad.npy"), "--path", "statevector")
    check(r.returncode == 1 and "state limit" in r.stderr and not os.path.exists(P("bad.npy")),
          "--path statevector at 40 qubits fails clearly: " + r.stderr)
    np.save(P("X16.npy"), rng.uniform(0, np.pi, (4, 16)))
    r = run("--map", "iqp", "--x", P("X16.npy"), "--out", P("bad.npy"), "--path", "mps")
    check(r.returncode == 1 and "not local enough" in r.stderr and not os.path.exists(P("bad.npy")),
          "--path mps on iqp(16) fails clearly: " + r.stderr)
    r = run("--map", "zz", "--x", P("X16.npy"), "--out", P("bad.npy"), "--path", "tensor")
    check(r.returncode == 2 and "--path" in r.stderr, "bad --path value exits 2: " + r.stderr)

if failures:
    print("test_mps_ref: %d checks FAILED (seed %d)" % (len(failures), seed))
    sys.exit(1)
print("test_mps_ref: all checks passed")
