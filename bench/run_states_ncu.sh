#!/bin/bash
# Nsight Compute over the state construction kernels of qk-bench zz16 (prep and the passes), and
# the GPU suite at the given qubit counts. Logs under $OUT; run from the repo root.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $(cat bench/commit.txt 2>/dev/null)"
  B=/tmp/bn
  [ -x $B/bench/qk-bench ] || rm -rf $B
  [ -d $B ] || meson setup $B . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null
  ninja -C $B bench/qk-bench tests/test_gpu_engine examples/qk-gram >$OUT/build.log 2>&1; echo "build rc $?"
  timeout 200 ncu --kernel-name regex:"qk__k_prep|qk__k_pass" --launch-count 6 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
      $B/bench/qk-bench --cases zz16 --reps 1 > $OUT/ncu-states.txt 2>&1; echo "ncu rc $?"
  grep -E "qk__k_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp" $OUT/ncu-states.txt | head -60
  for q in ${QS:-}; do
    QK_TEST_SEED=$RANDOM timeout 300 $B/tests/test_gpu_engine 20 0 $q > $OUT/test_gpu.log 2>&1
    echo "suite q=$q rc $? : $(grep -E 'checks, ' $OUT/test_gpu.log)"; grep -E "FAIL" $OUT/test_gpu.log | head -5
  done
} 2>&1 | tee $OUT/ncu.log
