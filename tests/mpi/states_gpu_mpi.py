#!/usr/bin/env python3
"""qk_gram_mpi_states with device states under mpirun -n 1 and 2 (tests/mpi/test_states_gpu_mpi.cpp;
rank r on GPU r mod the GPUs). Exit 77 (meson: skipped) where the program finds no CUDA device.

usage: states_gpu_mpi.py --mpirun MPIRUN --exe TEST_STATES_GPU_MPI --dir DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env, oversubscribe  # noqa: E402  (tests/mpi is not a package)

ap = argparse.ArgumentParser()
ap.add_argument("--mpirun", required=True)
ap.add_argument("--exe", required=True)
ap.add_argument("--dir", required=True)
args = ap.parse_args()
env = mpi_env()
ver = subprocess.run([args.mpirun, "--version"], capture_output=True, text=True, timeout=60, env=env)
extra = oversubscribe(ver.stdout + ver.stderr)
root = os.path.abspath(args.dir)
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)
failed = False
for n in (1, 2):
    p = subprocess.run([args.mpirun, "-n", str(n)] + extra + [args.exe, root], capture_output=True, text=True,
                       timeout=540, env=env)
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    if "no CUDA device: skipped" in p.stdout:
        sys.exit(77)
    if p.returncode != 0:
        print("FAIL: mpirun -n %d: exit %d" % (n, p.returncode))
        failed = True
shutil.rmtree(root, ignore_errors=True)
sys.exit(1 if failed else 0)
