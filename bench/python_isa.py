#!/usr/bin/env python3
"""qk.gram's CPU throughput with the extension built for different instruction sets
(docs/benchmarks.md, "Portable wheels"): the same calls timed against two or more builds of the
Python package, e.g. a portable one (-Dnative=false, what a wheel ships) and a -march=native one.

Each build runs in its own child process (PYTHONPATH=<build>/src/python); the children are
started in turn, build A, build B, A, B, ... so a slow phase of the shared machine hits both.
A child times `qk.gram(X)` (K(X, X), fp64, device="cpu") for each case after one warm-up call
and prints the times; the parent reports min and median per build and case, and the ratio of
the medians to the first build.

    python3 bench/python_isa.py --rounds 5 portable=build-port native=build-nat \\
        --out /tmp/out/python-isa.json
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# (qubits, samples, threads): zz(reps=2), K(X, X), fp64
CASES = [(8, 4000, 1), (8, 4000, 2), (12, 1000, 1), (12, 1000, 2)]

CHILD = r"""
import json, sys, time
import numpy as np
import qk
out = []
for q, n, t in json.loads(sys.argv[1]):
    X = np.random.default_rng(q).uniform(0, 2 * np.pi, (n, q))
    qk.gram(X[:64], device="cpu", threads=t)
    t0 = time.perf_counter()
    qk.gram(X, device="cpu", threads=t)
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=BUILDDIR (a Meson build with the Python package)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in a.builds]
    times = {name: [[] for _ in CASES] for name, _ in builds}
    load = [os.getloadavg()]
    for _ in range(a.rounds):
        for name, bdir in builds:
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(bdir), "src", "python"))
            r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=env, check=True,
                               capture_output=True, text=True)
            for i, s in enumerate(json.loads(r.stdout)):
                times[name][i].append(s)
    load.append(os.getloadavg())
    here = os.path.dirname(os.path.abspath(__file__))
    res = {"bench": "python_isa", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "cpu": platform.processor() or platform.machine(), "loadavg": load, "rounds": a.rounds, "cases": []}
    base = builds[0][0]
    for i, (q, n, t) in enumerate(CASES):
        row = {"case": "zz(reps=2) %d qubits n=%d threads=%d" % (q, n, t)}
        for name, _ in builds:
            v = times[name][i]
            row[name] = {"min_s": min(v), "median_s": statistics.median(v), "all_s": v}
            row[name]["ratio_to_" + base] = statistics.median(v) / statistics.median(times[base][i])
        res["cases"].append(row)
        print("%-40s " % row["case"] + "  ".join("%s %.3f/%.3f s (x%.2f)" % (name, row[name]["min_s"], row[name]["median_s"],
              row[name]["ratio_to_" + base]) for name, _ in builds))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
