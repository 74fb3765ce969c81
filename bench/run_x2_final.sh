#!/bin/bash
# One call on nvidia-h200-x2: the structured state pass under compute-sanitizer (single qk-gram
# jobs on GPU 0), then bench/mpi_scaling.py: qk-gram (both GPUs in one process) against mpirun
# -n 2 qk-gram-mpi (one GPU per rank) and 1 rank, K to a file in /dev/shm (RAM: the disk is not
# the bound). Logs under $OUT; run from the repo root.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nvcc --version | tail -1
  mpirun --version | head -1; echo "commit $(cat bench/commit.txt 2>/dev/null)"; free -g | head -2; df -h /dev/shm | tail -1
  B=/tmp/bx
  meson setup $B . -Dgpu_arch=90 -Dmpi=auto -Dpython=disabled -Dprofiler=false >/dev/null &&
    ninja -C $B examples/qk-gram examples/qk-gram-mpi >$OUT/build.log 2>&1; echo "build rc $?"
  python3 -c "import numpy as np; r=np.random.default_rng(7); np.save('/tmp/x13.npy', r.random((12,13))*6.28); np.save('/tmp/x16.npy', r.random((6,16))*6.28)"
  for t in memcheck racecheck initcheck synccheck; do
    for x in x16 x13; do for pr in fp32 fp64; do
      timeout 200 compute-sanitizer --tool $t --error-exitcode 9 $B/examples/qk-gram --x /tmp/$x.npy --map 'zz(reps=2)' \
        --device cuda --gpus 0 --precision $pr --out /tmp/K-$t.npy > /tmp/san.log 2>&1
      echo "$t $x $pr rc $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tr '\n' ' ')"
    done; done
  done
  [ -n "$SKIP_MPI" ] && exit 0
  mkdir -p /dev/shm/mpis
  timeout 400 python3 bench/mpi_scaling.py --build $B --device cuda --ranks 1,2 --cases ${CASES:-zz16:16384,zz12:32768} \
    --dir /dev/shm/mpis --json $OUT/mpi_scaling.json; echo "mpi_scaling rc $?"
  rm -rf /dev/shm/mpis
} 2>&1 | tee $OUT/x2.log
