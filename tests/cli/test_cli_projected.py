#!/usr/bin/env python3
"""qk-gram --projected [--gamma G]: the projected quantum kernel (qk_gram_projected) end to end.

K(X,X) and K(X,Y) against a numpy reference written here from the definitions, not from qk:
Qiskit's ZZFeatureMap statevector (qubit 0 the least significant bit), each qubit's reduced
density matrix by an explicit partial trace, K = exp(-gamma sum_k ||rho_k(x) - rho_k(y)||_F^2)
(1e-12; --precision fp32: a float32 file, 1e-6). The MPS path: --path mps against --path
statevector and numpy at 12 qubits, and zz(reps=2,ent=linear) at 40 and 100 qubits against
numpy's light-cone reduced states (1e-12). --device cuda: on a GPU host against --device cpu
(1e-12), without one the fidelity kernel's error (exit 1, the same message). The bad command
lines (exit 2, no output), and SIGINT / SIGTERM during a long job (exit 130 / 143, the old K.npy
untouched, no temporary).

usage: test_cli_projected.py PATH/TO/qk-gram   (exit 77 = skip when numpy is missing)"""
import os, signal, subprocess, sys, tempfile, time

from cli_common import EXE, check, cpu_seconds, failures, need_numpy, seeded_rng

np = need_numpy("numpy is not installed: skipping the qk-gram --projected tests")


def zz_states(X, reps=2, alpha=2.0, linear=False):
    n, q = X.shape
    dim = 1 << q
    idx = np.arange(dim)
    bit = [(idx >> k) & 1 for k in range(q)]
    S = np.empty((n, dim), complex)
    for s in range(n):
        x, psi = X[s], np.zeros(dim, complex)
        psi[0] = 1.0
        for _ in range(reps):
            for k in range(q):
                lo = idx[bit[k] == 0]
                hi = lo | (1 << k)
                a, b = psi[lo].copy(), psi[hi].copy()
                psi[lo], psi[hi] = (a + b) / np.sqrt(2.0), (a - b) / np.sqrt(2.0)
            for k in range(q):
                psi = psi * np.where(bit[k] == 1, np.exp(1j * alpha * x[k]), 1.0)
            for i in range(q):
                for j in range(i + 1, i + 2 if linear else q):
                    if j >= q:
                        break
                    t = alpha * (np.pi - x[i]) * (np.pi - x[j])
                    psi = psi * np.where((bit[i] ^ bit[j]) == 1, np.exp(1j * t), 1.0)
        S[s] = psi
    return S


def rdms(S, q):
    """each state's one-qubit reduced density matrices, (n, q, 2, 2), by partial traces"""
    out = np.empty((len(S), q, 2, 2), complex)
    for s, v in enumerate(S):
        t = v.reshape((2,) * q)   # axis 0 is the highest bit (qubit q-1)
        for k in range(q):
            m = np.moveaxis(t, q - 1 - k, 0).reshape(2, -1)
            out[s, k] = m @ m.conj().T
    return out


def rdms_linear(X, reps=2):
    """the one-qubit reduced density matrices of zz(reps, ent=linear) at any qubit count, by light
    cones: the ZZ gates of a layer are diagonal and commute, so qubit k's reduced state depends on
    the qubits within reps of it only; each is the partial trace of the map on that window (at most
    2 reps + 1 qubits, the chain's ends where they fall in it), simulated in full."""
    n, q = X.shape
    out = np.empty((n, q, 2, 2), complex)
    for k in range(q):
        lo, hi = max(0, k - reps), min(q, k + reps + 1)
        out[:, k] = rdms(zz_states(X[:, lo:hi], reps, linear=True), hi - lo)[:, k - lo]
    return out


def projected(RA, RB, gamma):
    d = RA[:, None] - RB[None, :]                       # (n, m, q, 2, 2)
    return np.exp(-gamma * np.sum(np.abs(d) ** 2, axis=(2, 3, 4)))


def run(*args, **kw):
    return subprocess.run([EXE] + list(args), capture_output=True, text=True, **kw)


def temps(d):
    return sorted(f for f in os.listdir(d) if ".tmp." in f)


def main():
    rng, _ = seeded_rng()
    with tempfile.TemporaryDirectory() as d:
        P = lambda n: os.path.join(d, n)
        X = rng.uniform(0, np.pi, (23, 4))
        Y = rng.uniform(0, np.pi, (9, 4))
        np.save(P("X.npy"), X)
        np.save(P("Y.npy"), Y)
        RX, RY = rdms(zz_states(X), 4), rdms(zz_states(Y), 4)

        r = run("--projected", "--gamma", "0.7", "--map", "zz(reps=2)", "--x", P("X.npy"), "--out", P("K.npy"), "--quiet")
        check(r.returncode == 0, "K(X,X): exit 0 (got %d): %s" % (r.returncode, r.stderr.strip()))
        if r.returncode == 0:
            K = np.load(P("K.npy"))
            err = np.abs(K - projected(RX, RX, 0.7)).max()
            check(K.dtype == np.float64 and K.shape == (23, 23) and err <= 1e-12, "K(X,X) vs numpy: %s %s, max abs err %.3g" % (K.dtype, K.shape, err))
            check(np.array_equal(K, K.T) and np.all(np.diag(K) == 1.0), "K(X,X) symmetric with a unit diagonal")

        r = run("--projected", "--map", "zz(reps=2)", "--x", P("X.npy"), "--y", P("Y.npy"), "--out", P("K.npy"))
        check(r.returncode == 0 and "gamma 1" in r.stdout, "K(X,Y), default gamma: exit 0, gamma 1 said (%d): %s %s" % (r.returncode, r.stdout, r.stderr))
        if r.returncode == 0:
            K = np.load(P("K.npy"))
            err = np.abs(K - projected(RX, RY, 1.0)).max()
            check(K.shape == (23, 9) and err <= 1e-12, "K(X,Y) vs numpy, gamma 1: %s, max abs err %.3g" % (K.shape, err))

        r = run("--projected", "--gamma=2.5", "--precision", "fp32", "--map", "zz(reps=2)", "--x", P("X.npy"), "--y", P("Y.npy"),
                "--out", P("K32.npy"), "--quiet")
        check(r.returncode == 0, "fp32: exit 0 (%d): %s" % (r.returncode, r.stderr.strip()))
        if r.returncode == 0:
            K = np.load(P("K32.npy"))
            err = np.abs(K - projected(RX, RY, 2.5)).max()
            check(K.dtype == np.float32 and err <= 1e-6, "fp32 K(X,Y) vs numpy: %s, max abs err %.3g" % (K.dtype, err))

        # ---- the MPS path (--path mps; auto beyond 30 qubits) against the statevector path and
        # the light-cone reference; the engine and path the info line names ----
        X12 = rng.uniform(0, np.pi, (11, 12))
        np.save(P("X12.npy"), X12)
        lin = "zz(reps=2,ent=linear)"
        R12 = rdms(zz_states(X12, linear=True), 12)
        check(np.abs(R12 - rdms_linear(X12)).max() < 1e-13, "the light-cone reference = the full partial traces at 12 qubits")
        Ks = {}
        for path in ("mps", "statevector"):
            r = run("--projected", "--gamma", "0.3", "--map", lin, "--x", P("X12.npy"), "--out", P("K12%s.npy" % path),
                    "--path", path, "--device", "cpu")
            check(r.returncode == 0 and "CPU engine, path %s" % path in r.stdout,
                  "12 qubits --path %s: exit 0, the line names the CPU engine and the path (%d): %s %s" % (path, r.returncode, r.stdout, r.stderr))
            if r.returncode == 0:
                Ks[path] = np.load(P("K12%s.npy" % path))
                err = np.abs(Ks[path] - projected(R12, R12, 0.3)).max()
                check(err <= 1e-12, "12 qubits --path %s vs numpy: max abs err %.3g" % (path, err))
        if len(Ks) == 2:
            err = np.abs(Ks["mps"] - Ks["statevector"]).max()
            check(err <= 1e-12,
                  "12 qubits: --path mps vs --path statevector, max abs err %.3g" % err)

        X40, Y40 = rng.uniform(0, np.pi, (9, 40)), rng.uniform(0, np.pi, (5, 40))
        np.save(P("X40.npy"), X40)
        np.save(P("Y40.npy"), Y40)
        R40, S40 = rdms_linear(X40), rdms_linear(Y40)
        for extra, ref, what in (([], projected(R40, R40, 0.8), "K(X,X), auto"),
                                 (["--path", "mps", "--y", P("Y40.npy")], projected(R40, S40, 0.8), "K(X,Y), --path mps")):
            r = run("--projected", "--gamma", "0.8", "--map", lin, "--x", P("X40.npy"), "--out", P("K40.npy"), *extra)
            check(r.returncode == 0 and "path mps" in r.stdout, "40 qubits %s: exit 0 on the MPS path (%d): %s %s" % (what, r.returncode, r.stdout, r.stderr))
            if r.returncode == 0:
                K = np.load(P("K40.npy"))
                err = np.abs(K - ref).max()
                check(K.shape == ref.shape and err <= 1e-12 and K.min() < 0.99,
                      "40 qubits %s vs the light-cone reference: %s, max abs err %.3g, min %.3g" % (what, K.shape, err, K.min()))
        r = run("--projected", "--map", lin, "--x", P("X40.npy"), "--out", P("bad.npy"), "--path", "statevector")
        check(r.returncode == 1 and "30" in r.stderr and not os.path.exists(P("bad.npy")),
              "40 qubits --path statevector: exit 1 naming the 30-qubit limit, no output (%d): %s" % (r.returncode, r.stderr.strip()))
        if os.path.exists(P("bad.npy")):
            os.remove(P("bad.npy"))   # a failed check's output: not the later checks' business

        X100 = rng.uniform(0, np.pi, (6, 100))
        np.save(P("X100.npy"), X100)
        r = run("--projected", "--gamma", "0.2", "--map", lin, "--x", P("X100.npy"), "--out", P("K100.npy"), "--threads", "2")
        check(r.returncode == 0 and "path mps" in r.stdout, "100 qubits: exit 0 on the MPS path (%d): %s %s" % (r.returncode, r.stdout, r.stderr))
        if r.returncode == 0:
            K = np.load(P("K100.npy"))
            R100 = rdms_linear(X100)
            err = np.abs(K - projected(R100, R100, 0.2)).max()
            check(np.all(np.isfinite(K)) and np.array_equal(K, K.T) and np.all(np.diag(K) == 1.0) and err <= 1e-12,
                  "100 qubits: finite, symmetric, unit diagonal, vs the light-cone reference max abs err %.3g" % err)

        # ---- --device cuda: on a GPU host the same K as the CPU engine; without one the error the
        # fidelity kernel's --device cuda gives (exit status and message) ----
        rf = run("--map", "zz", "--x", P("X.npy"), "--out", P("Kf.npy"), "--device", "cuda", "--quiet")
        if rf.returncode != 0:
            for args in (["--x", P("X12.npy")], ["--x", P("X40.npy"), "--path", "mps"]):
                r = run("--projected", "--map", lin, *args, "--out", P("bad.npy"), "--device", "cuda")
                check(r.returncode == rf.returncode == 1 and r.stderr == rf.stderr and "cuda" in r.stderr and not os.path.exists(P("bad.npy")),
                      "--projected --device cuda without a GPU: the fidelity path's exit %d and message %r (got %d %r)"
                      % (rf.returncode, rf.stderr.strip(), r.returncode, r.stderr.strip()))
                if os.path.exists(P("bad.npy")):
                    os.remove(P("bad.npy"))
            print("skip: --projected on the GPU engine (no CUDA device): " + rf.stderr.strip()[-200:])
        else:
            print("GPU engine: --projected checked on the device")
            for name, args in (("12 qubits statevector", ["--x", P("X12.npy"), "--path", "statevector"]),
                               ("12 qubits mps", ["--x", P("X12.npy"), "--path", "mps"]),
                               ("40 qubits K(X,Y)", ["--x", P("X40.npy"), "--y", P("Y40.npy")]),
                               ("100 qubits", ["--x", P("X100.npy")]),
                               ("product map", ["--x", P("X12.npy"), "--map", "angle(rot=y)"])):
                m = [] if "--map" in args else ["--map", lin]
                K = {}
                for dev in ("cpu", "cuda"):
                    r = run("--projected", "--gamma", "0.6", *m, *args, "--out", P("K%s.npy" % dev), "--device", dev, "--gpus", "0")
                    engine = "CUDA engine on GPU 0" if dev == "cuda" else "CPU engine"
                    check(r.returncode == 0 and engine in r.stdout, "%s --device %s: exit 0, the line names the %s (%d): %s %s"
                          % (name, dev, engine, r.returncode, r.stdout, r.stderr))
                    if r.returncode == 0:
                        K[dev] = np.load(P("K%s.npy" % dev))
                if len(K) == 2:
                    err = np.abs(K["cuda"] - K["cpu"]).max()
                    check(K["cuda"].dtype == np.float64 and err <= 1e-12, "%s: --device cuda vs cpu, max abs err %.3g" % (name, err))

        # ---- bad command lines: exit 2, a message naming the option, no output file ----
        base = ["--map", "zz", "--x", P("X.npy"), "--out", P("bad.npy")]
        for args, words in ((["--projected", "--gamma", "0"] + base, "--gamma"),
                            (["--projected", "--gamma", "-1"] + base, "--gamma"),
                            (["--projected", "--gamma", "nan"] + base, "--gamma"),
                            (["--projected", "--gamma", "1x"] + base, "--gamma"),
                            (["--projected", "--gamma", "inf"] + base, "--gamma"),
                            (["--gamma", "2"] + base, "--projected"),
                            (["--projected", "--gamma", "1", "--gamma", "2"] + base, "twice"),
                            (["--projected=1"] + base, "no value"),
                            (["--projected", "--gpus", "0,1"] + base, "--gpus"),
                            (["--projected", "--path", "dense"] + base, "--path"),
                            (["--projected", "--tol", "1e-3"] + base, "--tol"),
                            (["--projected", "--states", P("X.npy"), "--out", P("bad.npy")], "--states"),
                            (["--projected", "--demo"], "--demo")):
            r = run(*args)
            check(r.returncode == 2 and words in r.stderr and not os.path.exists(P("bad.npy")),
                  "%s: exit 2 naming %r, no output (%d): %s" % (" ".join(a.replace(d, "") for a in args), words, r.returncode, r.stderr.strip()))
        r = run("--projected", "--map", "zz", "--x", P("X.npy"), "--y", P("Y.npy"), "--out", P("X.npy"))
        check(r.returncode == 2 and "same file" in r.stderr, "--out over --x refused: %d %s" % (r.returncode, r.stderr.strip()))

        # ---- SIGINT / SIGTERM during a long job (zz(reps=2), all-to-all, at 20 qubits, 150
        # samples: the statevector path, each state 2^20 amplitudes, ~15 s of CPU; hea's ring
        # would take the MPS path, where the projected kernel of 150 samples takes < 0.5 s). The signal goes once the job has had 0.5 s of CPU time; before
        # K is written no output exists and the handler exits at once: measured in the CPU time
        # spent after the signal (< 0.5 s), which a loaded machine does not stretch. ----
        np.save(P("big.npy"), rng.uniform(0, np.pi, (150, 20)))
        OLD = b"old K, not to be touched"
        for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            with open(P("K.npy"), "wb") as f:
                f.write(OLD)
            # --device cpu: the CPU engine's seconds (on a GPU host the default engine is done
            # before the signal is due)
            p = subprocess.Popen([EXE, "--projected", "--map", "zz(reps=2)", "--x", P("big.npy"), "--out", P("K.npy"),
                                  "--threads", "2", "--device", "cpu", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            t_start, cpu0, running = time.perf_counter(), 0.0, False
            while p.poll() is None and time.perf_counter() - t_start < 120:
                try:
                    cpu0 = cpu_seconds(p.pid)
                except (OSError, IndexError):
                    break
                if cpu0 >= 0.5:
                    running = True
                    break
                time.sleep(0.02)
            if not running:
                p.kill()
                out, err = p.communicate()
                check(False, "%s: the job was not running when the signal was due (rc %s): %s" % (sig.name, p.returncode, err.strip()))
                continue
            os.kill(p.pid, sig)
            _, status, ru = os.wait4(p.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
            err = p.stderr.read()
            p.stdout.close()
            p.stderr.close()
            cpu_after = ru.ru_utime + ru.ru_stime - cpu0
            check(rc == code, "%s: exit %d (got %s): %s" % (sig.name, code, rc, err.strip()))
            check(cpu_after < 0.5, "%s: stopped after %.2f s of CPU time (< 0.5 s: at once, not the whole job)" % (sig.name, cpu_after))
            check(temps(d) == [], "%s: no temporary file left (%s)" % (sig.name, temps(d)))
            check(open(P("K.npy"), "rb").read() == OLD, "%s: the previous K.npy is untouched" % sig.name)
            check("was not written" in err, "%s: the stop is reported: %r" % (sig.name, err))

    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("qk-gram --projected: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
