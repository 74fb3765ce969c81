#!/usr/bin/env python3
"""qk-gram --projected [--gamma G]: the projected quantum kernel (qk_gram_projected) end to end.

K(X,X) and K(X,Y) against a numpy reference written here from the definitions, not from qk:
Qiskit's ZZFeatureMap statevector (qubit 0 the least significant bit), each qubit's reduced
density matrix by an explicit partial trace, K = exp(-gamma sum_k ||rho_k(x) - rho_k(y)||_F^2)
(1e-12; --precision fp32: a float32 file, 1e-6). The bad command lines (exit 2, no output), and
SIGINT / SIGTERM during a long job (exit 130 / 143, the old K.npy untouched, no temporary).

usage: test_cli_projected.py PATH/TO/qk-gram   (exit 77 = skip when numpy is missing)"""
import os, signal, subprocess, sys, tempfile, time

from cli_common import EXE, check, cpu_seconds, failures, need_numpy, seeded_rng

np = need_numpy("numpy is not installed: skipping the qk-gram --projected tests")


def zz_states(X, reps=2, alpha=2.0):
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
                for j in range(i + 1, q):
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
                            (["--projected", "--device", "cuda"] + base, "CPU engine"),
                            (["--projected", "--path", "mps"] + base, "mps"),
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
            p = subprocess.Popen([EXE, "--projected", "--map", "zz(reps=2)", "--x", P("big.npy"), "--out", P("K.npy"),
                                  "--threads", "2", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
