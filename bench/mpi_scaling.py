#!/usr/bin/env python3
"""qk-gram (one process) against qk-gram-mpi on R ranks, K to a file, the same job in one run.

usage: bench/mpi_scaling.py --build BUILD [--device cuda|cpu] [--ranks 1,2] [--cases zz8:32768,zz12:16384]
                            [--dir /tmp/mpi_scaling] [--json OUT.json] [--mpirun mpirun] [--threads N]

For each case (map zz reps=2 with F features, n samples, uniform in [0, pi], seed 1): qk-gram
writes K.npy, then `mpirun -n R qk-gram-mpi` writes K_R.npy for each R. Each line gives the wall
time of the Gram as the program reports it (its "done:" line: the Gram and the file, not the
reading of X), the ranks' band finish times (balance), and the largest |K_R - K| (0 on the CPU
engine: bitwise; float32 accuracy on the GPU). One rank per GPU: rank r of the node takes GPU r.
On the CPU each rank gets --threads threads (default: cores / R, as qk-gram-mpi does).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--cases", default="zz8:32768,zz12:16384")
    ap.add_argument("--dir", default="/tmp/mpi_scaling")
    ap.add_argument("--json")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the K files")
    a = ap.parse_args()
    import numpy as np
    env = dict(os.environ)
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    ver = subprocess.run([a.mpirun, "--version"], capture_output=True, text=True, env=env).stdout
    extra = ["--oversubscribe"] if "Open MPI" in ver else []
    os.makedirs(a.dir, exist_ok=True)
    qk_gram = os.path.join(a.build, "qk-gram")
    qk_gram_mpi = os.path.join(a.build, "qk-gram-mpi")
    res = {"device": a.device, "mpirun": ver.strip().splitlines()[0] if ver.strip() else "?", "rows": [],
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": os.uname().nodename,
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "loadavg_start": os.getloadavg()[0], "cores": os.cpu_count()}
    for case in a.cases.split(","):
        m = re.match(r"zz(\d+):(\d+)$", case)
        f, n = int(m.group(1)), int(m.group(2))
        rng = np.random.default_rng(1)
        xp = os.path.join(a.dir, "X_%d_%d.npy" % (f, n))
        np.save(xp, rng.uniform(0, np.pi, (n, f)))
        common = ["--map", "zz(reps=2)", "--x", xp, "--device", a.device]
        ref = os.path.join(a.dir, "K.npy")
        t = ["--threads", str(a.threads)] if a.threads else []
        p = subprocess.run([qk_gram] + common + t + ["--out", ref], capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            sys.exit(1)
        secs = float(re.search(r" in ([0-9.]+) s", p.stdout).group(1))
        row = {"case": case, "features": f, "n": n, "program": "qk-gram", "ranks": 1, "seconds": secs,
               "Gpairs_s": n * n / secs * 1e-9}
        print("%-10s qk-gram           %8.3f s  %7.3f Gpairs/s" % (case, secs, row["Gpairs_s"]), flush=True)
        res["rows"].append(row)
        K = np.load(ref, mmap_mode="r")
        for R in [int(r) for r in a.ranks.split(",")]:
            out = os.path.join(a.dir, "K_%d.npy" % R)
            t = ["--threads", str(a.threads)] if a.threads else []
            p = subprocess.run([a.mpirun, "-n", str(R)] + extra + [qk_gram_mpi] + common + t + ["--out", out],
                               capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(p.stdout, p.stderr)
                sys.exit(1)
            secs = float(re.search(r" in ([0-9.]+) s on", p.stdout).group(1))
            bands = [float(v) for v in re.search(r"after \(s\):([0-9. ]+)\(", p.stdout).group(1).split()]
            KR = np.load(out, mmap_mode="r")
            err = 0.0
            for i0 in range(0, n, 4096):
                err = max(err, float(np.max(np.abs(KR[i0:i0 + 4096].astype(np.float64) - K[i0:i0 + 4096]))))
            row = {"case": case, "features": f, "n": n, "program": "qk-gram-mpi", "ranks": R, "seconds": secs,
                   "Gpairs_s": n * n / secs * 1e-9, "band_done_s": bands,
                   "slowest_over_mean": max(bands) / (sum(bands) / len(bands)), "max_abs_diff_vs_qk_gram": err}
            print("%-10s qk-gram-mpi -n %d %8.3f s  %7.3f Gpairs/s  bands %s (slowest/mean %.3f)  max|dK| %.2g" %
                  (case, R, secs, row["Gpairs_s"], " ".join("%.3f" % b for b in bands), row["slowest_over_mean"], err),
                  flush=True)
            res["rows"].append(row)
            del KR
            if not a.keep:
                os.remove(out)
        del K
        if not a.keep:
            os.remove(ref)
        os.remove(xp)
    res["loadavg_end"] = os.getloadavg()[0]
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
