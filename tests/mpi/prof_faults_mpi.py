#!/usr/bin/env python3
"""Runs tests/mpi/prof_faults_mpi.c under mpirun -n 2 (allocation failures in qk_prof's MPI-wide
reports, on each rank in turn): exit 0 and its "all checks passed" line. Exit 77 where MPI cannot
start a process. Usage: prof_faults_mpi.py --mpirun MPIRUN --exe PROF_FAULTS_MPI"""
import argparse, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env, oversubscribe  # noqa: E402  (tests/mpi is not a package)

ap = argparse.ArgumentParser()
ap.add_argument("--mpirun")
ap.add_argument("--exe")
args = ap.parse_args()

env = mpi_env()   # MPI's own allocations kept until exit are not the profiler's
ver = subprocess.run([args.mpirun, "--version"], capture_output=True, text=True, env=env)
extra = oversubscribe(ver.stdout + ver.stderr)
try:
    p = subprocess.run([args.mpirun, "-n", "2"] + extra + [args.exe], capture_output=True, text=True, env=env, timeout=280)
except subprocess.TimeoutExpired:
    print("FAIL: prof_faults_mpi did not end within 280 s (a rank stuck in a collective?)")
    sys.exit(1)
print(p.stdout[-4000:], p.stderr[-4000:])
if p.returncode != 0 and "prof_faults_mpi" not in p.stdout + p.stderr:
    print("skipping: mpirun cannot start the program here")
    sys.exit(77)
ok = p.returncode == 0 and "prof_faults_mpi: all checks passed" in p.stdout
print("ok" if ok else "FAIL: prof_faults_mpi exited %d" % p.returncode)
sys.exit(0 if ok else 1)
