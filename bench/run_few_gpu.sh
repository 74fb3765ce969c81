#!/bin/bash
# Few-qubit Gram probe (issue 11): the candidate kernels of bench/small_gram_probe.cu against the
# write floor, beside the library's kernel (qk-bench zz4/zz6) and an Nsight Compute look at it.
# Logs under $OUT. Run from the repo root on the GPU machine: bash bench/run_few_gpu.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  B=/tmp/bfew; rm -rf $B
  (meson setup $B . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null && ninja -C $B bench/qk-bench >$OUT/build.log 2>&1; echo "build rc $?") &
  nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/probe "$(dirname "$0")/small_gram_probe.cu" 2>&1 | grep -v "^$"; echo "probe build rc $?"
  timeout 240 /tmp/probe ${N:-32768}; echo "probe rc $?"
  wait
  timeout 60 $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases zz4 ; echo "bench rc $?"
  timeout 120 ncu --kernel-name regex:qk__k_gram --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats $B/bench/qk-bench --cases zz4 >$OUT/ncu-zz4.txt 2>&1
  echo "ncu rc $?"; grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Block Limit|Theoretical Occ|Memory \[%\]|Compute \(SM\)" $OUT/ncu-zz4.txt | head -40
} 2>&1 | tee $OUT/few.log
