#!/usr/bin/env python3
"""The Python package's numbers on this machine's CPU (docs/benchmarks.md, "Python package"):

1. call overhead at n=2000 (zz reps=2, 8 qubits, K(X,X), fp64, all cores): the wrapper's own
   time (the call's wall time minus the qk_gram call inside it, which the extension records);
   qk.gram(X) in memory against the C API in memory (bench/qk-cpu-bench, same engine and size;
   both the median of 5 back-to-back calls, per run);
   qk.gram(X, out="K.npy") against qk-gram writing the same .npy (its own "done ... in T s"); and
   the fixed cost of one small call;
2. qk against qiskit-machine-learning's FidelityStatevectorKernel, ZZFeatureMap(reps=2), at
   400 x 6 and 1500 x 8: the same evaluate(X) call, qk.Kernel given the Qiskit circuit itself
   (so its conversion is timed too) and given the spec string.

Every figure is the median of several runs, the runs of the things compared interleaved: the
machine is shared, so a slow phase hits both sides. Load averages are recorded.

    PYTHONPATH=build/src/python python3 bench/python_cpu.py --build build \\
        --out /tmp/out/python-cpu.json
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

import qk


def med(xs):
    return statistics.median(xs)


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def overhead(build, reps):
    n, q = 2000, 8
    X = np.random.default_rng(1).uniform(0, 2 * np.pi, (n, q))
    bench = os.path.join(build, "bench", "qk-cpu-bench")
    cli = os.path.join(build, "examples", "qk-gram")
    res = {"case": "zz(reps=2), 8 qubits, n=2000, K(X,X), fp64, CPU, all cores", "reps": reps}
    c_mem, py_mem, cli_done, cli_wall, py_npy, inner = [], [], [], [], [], []
    qk.gram(X)                                               # warm-up: context, pages
    with tempfile.TemporaryDirectory() as d:
        xp, kp, kp2 = os.path.join(d, "X.npy"), os.path.join(d, "K.npy"), os.path.join(d, "K2.npy")
        np.save(xp, X)
        for _ in range(reps):
            if os.path.exists(bench):       # its own median of 5 qk_gram calls, states included
                c_mem.append(json.loads(subprocess.run([bench, "8", str(n)], check=True, capture_output=True,
                                                       text=True).stdout)["total_s"])
            # 5 calls back to back, their median: as qk-cpu-bench times its 5 calls
            t5, i5 = [], []
            for _ in range(5):
                t5.append(timed(lambda: qk.gram(X))[0])
                i5.append(qk._qk._last_gram_seconds())    # the qk_gram call inside it
            py_mem.append(med(t5))
            inner.append(med(i5))
            t, out = timed(lambda: subprocess.run([cli, "--map", "zz(reps=2)", "--x", xp, "--out", kp, "--device", "cpu"],
                                                  check=True, capture_output=True, text=True).stdout)
            cli_wall.append(t)
            cli_done.append(float(re.search(r" in ([0-9.]+) s", out).group(1)))
            py_npy.append(timed(lambda: qk.gram(X, out=kp2, device="cpu"))[0])
        assert np.array_equal(np.load(kp), np.load(kp2))
    small = np.random.default_rng(2).uniform(0, 1, (8, 8))
    qk.gram(small)
    per_call, per_call_inner = [], []
    for _ in range(300):
        per_call.append(timed(lambda: qk.gram(small))[0])
        per_call_inner.append(qk._qk._last_gram_seconds())
    wrapper = [a - b for a, b in zip(py_mem, inner)]
    res.update({
        "c_api_in_memory_s": med(c_mem) if c_mem else None,
        "python_in_memory_s": med(py_mem),
        "qk_gram_cli_done_s": med(cli_done),
        "qk_gram_cli_process_wall_s": med(cli_wall),
        "python_out_npy_s": med(py_npy),
        "python_small_call_us": med(per_call) * 1e6,
        "python_small_call_qk_gram_us": med(per_call_inner) * 1e6,
        "python_wrapper_s": med(wrapper),
        "python_wrapper_pct": 100.0 * med([w / i for w, i in zip(wrapper, inner)]),
        "samples": {"c_api_in_memory_s": c_mem, "python_in_memory_s": py_mem, "qk_gram_inside_python_s": inner,
                    "qk_gram_cli_done_s": cli_done,
                    "qk_gram_cli_process_wall_s": cli_wall, "python_out_npy_s": py_npy},
    })
    if c_mem:
        res["overhead_in_memory_pct"] = 100.0 * (res["python_in_memory_s"] / res["c_api_in_memory_s"] - 1.0)
    res["overhead_npy_vs_qk_gram_pct"] = 100.0 * (res["python_out_npy_s"] / res["qk_gram_cli_done_s"] - 1.0)
    return res


def vs_qiskit(n, d, reps_qiskit, reps_qk):
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from qiskit.circuit.library import ZZFeatureMap
    from qiskit_machine_learning.kernels import FidelityStatevectorKernel
    import qiskit
    import qiskit_machine_learning
    X = np.random.default_rng(3).uniform(0, np.pi, (n, d))
    fmap = ZZFeatureMap(d, reps=2)
    ref = FidelityStatevectorKernel(feature_map=fmap)
    k_circ = qk.Kernel(fmap)
    k_spec = qk.Kernel("zz(reps=2)")
    k_circ.evaluate(X[:4])
    t_ref, t_circ, t_spec = [], [], []
    K_ref = K = None
    for i in range(max(reps_qiskit, reps_qk)):
        if i < reps_qiskit:
            t, K_ref = timed(lambda: ref.evaluate(X))
            t_ref.append(t)
        for _ in range(max(1, reps_qk // reps_qiskit)):
            t, K = timed(lambda: k_circ.evaluate(X))
            t_circ.append(t)
            t_spec.append(timed(lambda: k_spec.evaluate(X))[0])
    return {
        "case": f"ZZFeatureMap({d}, reps=2), evaluate(X), X {n} x {d}",
        "qiskit": qiskit.__version__, "qiskit_machine_learning": qiskit_machine_learning.__version__,
        "qiskit_ml_s": med(t_ref), "qk_kernel_circuit_s": med(t_circ), "qk_kernel_spec_s": med(t_spec),
        "speedup_circuit": med(t_ref) / med(t_circ), "speedup_spec": med(t_ref) / med(t_spec),
        "max_abs_diff": float(np.abs(K - K_ref).max()),
        "samples": {"qiskit_ml_s": t_ref, "qk_kernel_circuit_s": t_circ, "qk_kernel_spec_s": t_spec},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--qiskit-reps", type=int, default=3)
    ap.add_argument("--no-qiskit", action="store_true", help="the overhead part only")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"bench": "python_cpu", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
           "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
           "qk": qk.__version__, "engine": qk.engine(), "loadavg_start": os.getloadavg(),
           "note": "medians of interleaved runs on a 2-core machine shared with other jobs"}
    out["overhead"] = overhead(a.build, a.reps)
    print(json.dumps(out["overhead"], indent=1), flush=True)
    out["vs_qiskit"] = []
    for n, d in () if a.no_qiskit else ((400, 6), (1500, 8)):
        r = vs_qiskit(n, d, a.qiskit_reps, a.reps)
        out["vs_qiskit"].append(r)
        print(json.dumps(r, indent=1), flush=True)
    out["loadavg_end"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
