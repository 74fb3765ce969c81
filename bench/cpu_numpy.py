#!/usr/bin/env python3
"""numpy peer for the CPU benchmark: K = abs(S @ S.conj().T)**2 for zz reps=2 states.
The states are built here (vectorized diagonal phases + Hadamards, Qiskit convention) with the
same inputs as bench/cpu_bench.c; only the Gram expression is timed (median of 5 after warm-up),
which is what a numpy user writes. Prints one JSON line."""
import json, math, sys, time
import numpy as np

def inputs(n, q):
    # the same LCG as cpu_bench.c
    s = 12345
    out = np.empty(n * q)
    for i in range(n * q):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out[i] = (s >> 11) * (2 * math.pi / 9007199254740992.0)
    return out.reshape(n, q)

def zz_states(X, reps=2, alpha=2.0):
    n, q = X.shape
    D = 1 << q
    b = (np.arange(D)[:, None] >> np.arange(q)[None, :]) & 1
    ph = X @ b.T
    for i in range(q):
        for j in range(i + 1, q):
            ph += np.outer((math.pi - X[:, i]) * (math.pi - X[:, j]), b[:, i] ^ b[:, j])
    diag = np.exp(1j * alpha * ph)
    psi = np.zeros((n, D), complex)
    psi[:, 0] = 1
    for _ in range(reps):
        for k in range(q):
            v = psi.reshape(n, D >> (k + 1), 2, 1 << k)
            a, c = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
            v[:, :, 0, :] = (a + c) / math.sqrt(2)
            v[:, :, 1, :] = (a - c) / math.sqrt(2)
        psi = psi * diag
    return psi

def main():
    q = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    S = zz_states(inputs(n, q))
    ts = []
    for r in range(6):
        t0 = time.perf_counter()
        K = np.abs(S @ S.conj().T) ** 2
        ts.append(time.perf_counter() - t0)
    t = sorted(ts[1:])[2]
    cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else {}
    blas = cfg.get("Build Dependencies", {}).get("blas", {}).get("name", "?") if isinstance(cfg, dict) else "?"
    print(json.dumps({"impl": "numpy", "numpy": np.__version__, "blas": blas, "qubits": q, "n": n,
                      "gram_s": round(t, 6), "gram_Mpairs_s": round(n * n / t * 1e-6, 3), "K01": float(K[0, 1])}))

if __name__ == "__main__":
    main()
