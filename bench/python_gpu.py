#!/usr/bin/env python3
"""The Python package on the GPU engine (bench/run.sh python-gpu runs it after tests/python):
  1. the call overhead: qk.gram(X) against qk-gram on the same data (zz reps=2, 8 qubits,
     n=2000 and n=20000, float32 K) and the wrapper's own time, medians of 7 after a warm-up;
  2. qk (GPU engine, fp64 and fp32) against qiskit-machine-learning's FidelityStatevectorKernel
     (on that machine's CPU) at 400 x 6 and 1500 x 8, ZZFeatureMap(reps=2), when qiskit imports.
usage: python_gpu.py BUILD_DIR OUT.json [QK_GRAM]   (qk importable: PYTHONPATH holds the built package)"""
import json, os, re, statistics, subprocess, sys, tempfile, time, warnings
import numpy as np, qk
B, out_path = sys.argv[1], sys.argv[2]
med = statistics.median
def timed(fn):
    t = time.perf_counter(); r = fn(); return time.perf_counter() - t, r
res = {"bench": "python_gpu", "engine": qk.engine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "commit": os.environ.get("COMMIT") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
       "overhead": [], "vs_qiskit": []}
cli = sys.argv[3] if len(sys.argv) > 3 else os.path.join(B, "examples", "qk-gram")
with tempfile.TemporaryDirectory() as d:
    for n in (2000, 20000):
        X = np.random.default_rng(1).uniform(0, 2 * np.pi, (n, 8))
        xp, kp, kp2 = os.path.join(d, "X.npy"), os.path.join(d, "K.npy"), os.path.join(d, "K2.npy")
        np.save(xp, X)
        qk.gram(X, device="cuda")                                  # warm-up: context, autotune cache
        mem, inner, npy, cli_done = [], [], [], []
        for _ in range(7):
            mem.append(timed(lambda: qk.gram(X, device="cuda"))[0]); inner.append(qk._qk._last_gram_seconds())
            npy.append(timed(lambda: qk.gram(X, device="cuda", out=kp2))[0])
            o = subprocess.run([cli, "--map", "zz(reps=2)", "--x", xp, "--out", kp, "--device", "cuda"],
                               check=True, capture_output=True, text=True).stdout
            cli_done.append(float(re.search(r" in ([0-9.]+) s", o).group(1)))
        K = qk.gram(X, device="cuda")
        assert np.allclose(np.load(kp), K, atol=1e-6)
        r = {"case": f"zz(reps=2), 8 qubits, n={n}, K(X,X) float32, GPU engine", "python_in_memory_s": med(mem),
             "qk_gram_inside_python_s": med(inner), "python_wrapper_s": med([a - b for a, b in zip(mem, inner)]),
             "python_out_npy_s": med(npy), "qk_gram_cli_done_s": med(cli_done),
             "overhead_npy_vs_qk_gram_pct": 100 * (med(npy) / med(cli_done) - 1),
             "samples": {"python_in_memory_s": mem, "python_out_npy_s": npy, "qk_gram_cli_done_s": cli_done}}
        print(json.dumps({k: v for k, v in r.items() if k != "samples"}), flush=True)
        res["overhead"].append(r)
try:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from qiskit.circuit.library import ZZFeatureMap
    from qiskit_machine_learning.kernels import FidelityStatevectorKernel
except ImportError as e:
    print(f"qiskit comparison left out: {e}")
else:
    for n, dd in ((400, 6), (1500, 8)):
        X = np.random.default_rng(3).uniform(0, np.pi, (n, dd))
        fmap = ZZFeatureMap(dd, reps=2)
        ref = FidelityStatevectorKernel(feature_map=fmap)
        t_ref, K_ref = timed(lambda: ref.evaluate(X))
        row = {"case": f"ZZFeatureMap({dd}, reps=2), evaluate(X), X {n} x {dd}", "qiskit_ml_cpu_s": t_ref}
        for prec in ("fp64", "fp32"):
            k = qk.Kernel(fmap, device="cuda", precision=prec)
            k.evaluate(X)
            ts = [timed(lambda: k.evaluate(X))[0] for _ in range(7)]
            row[f"qk_gpu_{prec}_s"] = med(ts)
            row[f"speedup_{prec}"] = t_ref / med(ts)
            row[f"max_abs_diff_{prec}"] = float(np.abs(k.evaluate(X) - K_ref).max())
        print(json.dumps(row), flush=True)
        res["vs_qiskit"].append(row)
open(out_path, "w").write(json.dumps(res, indent=1) + "\n")
