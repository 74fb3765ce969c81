#!/bin/bash
# run 85: the store-only probe's shapes (4-qubit Gram)
set -u
W=/tmp/w85; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/probe4q .peer/probe4q.cu > $W/probe-build.log 2>&1
/tmp/probe4q 32768 > $W/probe4q.log 2>&1; echo "probe rc $?"; cat $W/probe4q.log
cd $W && tar czf $OUT/run85.tgz .
