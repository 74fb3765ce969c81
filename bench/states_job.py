#!/usr/bin/env python3
"""The whole job of K from a simulator's own states (issue 28), timed as a user feels it:
`qk-gram --states A.npy --out K.npy` beside the job a PyTorch user writes for the same file
(load A.npy, move it to the GPU, S = A A^H, K = |S|^2, back to the host, np.save), in the same
job, each under a fresh Python parent that reports its wall time and peak RSS (getrusage of the
child). The states are random unit vectors (complex64, the dtype simulators hand over), written
once; both outputs are compared (max |K_qk - K_torch|) and K's diagonal checked against 1.

usage: states_job.py --qk-gram PATH [--rows 10:40000,14:8000] [--dir DIR] [--json OUT]
                     [--qk-args "--device cuda"]
A row "<qubits>:<n>" is one job: n states of 2^qubits amplitudes, K(A,A) of n x n float32."""
import argparse, json, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_job import rss_of  # noqa: E402  (bench/ is not a package)

TORCH = r"""
import sys, time, numpy as np, torch
t0 = time.perf_counter()
A = np.load(sys.argv[1])
t1 = time.perf_counter()
a = torch.from_numpy(A).cuda()
S = a @ a.conj().T
K = (S.real ** 2 + S.imag ** 2).cpu().numpy()
torch.cuda.synchronize()
t2 = time.perf_counter()
np.save(sys.argv[2], K)
t3 = time.perf_counter()
print("torch: load %.3f s, to GPU + S A^H + |.|^2 + to host %.3f s, np.save %.3f s" % (t1 - t0, t2 - t1, t3 - t2))
"""


def timed(cmd):
    """(returncode, wall s, peak RSS MiB, stdout+stderr) of cmd, from a fresh Python parent
    (whole_job.rss_of)."""
    rc, wall, rss, out, err = rss_of(cmd)
    return rc, wall, rss, out + err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qk-gram", required=True)
    ap.add_argument("--rows", default="10:40000,14:8000")
    ap.add_argument("--dir", default="/tmp/qk_states_job")
    ap.add_argument("--json")
    ap.add_argument("--qk-args", default="--device cuda")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    out = []
    for row in a.rows.split(","):
        q, n = (int(v) for v in row.split(":"))
        D = 1 << q
        A = os.path.join(a.dir, "A.npy")
        rng = np.random.default_rng(q * 1000003 + n)
        S = (rng.standard_normal((n, D), dtype=np.float32) + 1j * rng.standard_normal((n, D), dtype=np.float32)).astype(np.complex64)
        S /= np.linalg.norm(S, axis=1, keepdims=True)
        np.save(A, S)
        del S
        Kq, Kt = os.path.join(a.dir, "Kq.npy"), os.path.join(a.dir, "Kt.npy")
        rq, wq, mq, oq = timed([a.qk_gram, "--states", A, "--out", Kq] + a.qk_args.split())
        rt, wt, mt, ot = timed([sys.executable, "-c", TORCH, A, Kt])
        r = {"qubits": q, "n": n, "states_GB": n * D * 8 / 1e9, "K_GB": n * n * 4 / 1e9,
             "qk_rc": rq, "qk_wall_s": wq, "qk_maxrss_MB": mq, "peer_rc": rt, "peer_wall_s": wt, "peer_maxrss_MB": mt,
             "peer_phases": ot.strip().splitlines()[0] if rt == 0 and ot.strip() else ot[-300:]}
        if rq == 0 and rt == 0:
            K1, K2 = np.load(Kq, mmap_mode="r"), np.load(Kt, mmap_mode="r")
            step = max(1, n // 2048)
            r["max_abs_diff_sampled"] = float(np.max(np.abs(np.asarray(K1[::step], dtype=np.float64) - np.asarray(K2[::step], dtype=np.float64))))
            r["diag_maxerr"] = float(np.max(np.abs(np.diagonal(K1)[:4096] - 1.0)))
            r["qk_speedup_vs_peer"] = wt / wq
        elif rq != 0:
            r["qk_output"] = oq[-500:]
        for f in (Kq, Kt):
            if os.path.exists(f):
                os.remove(f)
        os.remove(A)
        print(json.dumps(r), flush=True)
        out.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
