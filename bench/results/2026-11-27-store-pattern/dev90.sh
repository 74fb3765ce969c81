#!/bin/bash
# run 90: cublasLt's algorithms against cublasGemmEx's default on the Gauss shapes at 12 and 16 q
set -u
W=/tmp/w90; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/gap .peer/gemm_algo_probe.cu -lcublas -lcublasLt > $W/build.log 2>&1; echo "build rc $?"
timeout 400 /tmp/gap > $W/gemm-algo.log 2>&1; echo "probe rc $?"
grep -v "^  " $W/gemm-algo.log; grep -E "^  16 q fp16" $W/gemm-algo.log
cd $W && tar czf $OUT/run90.tgz .
