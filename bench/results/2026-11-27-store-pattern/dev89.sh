#!/bin/bash
# run 89 (H100): the final tree (4824fbf): issue 26 table (roof) with the peer; the GPU suite at 4, 12, 16 qubits
# and the whole job (qk-gram X.npy -> K.npy against torch_e2e.py) at zz8 n=20000 and zz12 n=16384
set -u
RUN=${RUN:-89}
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w$RUN; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine qk-gram) > $W/build-new.log 2>&1 &
wait
echo "builds $(( $(date +%s) - t0 )) s: $(tail -1 $W/build-new.log)"
NB=/tmp/bn/bench/qk-bench; BB=/tmp/bb/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
B=/tmp/bn COMMIT=${COMMIT:-4824fbf} CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 300 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $?"; cat $W/roof/roofline.md 2>/dev/null | head -30
B=/tmp/bn ROWS=zz8:20000,zz12:16384 timeout 200 bash bench/run.sh whole-job $W/wj > $W/wj-run.log 2>&1; echo "whole job rc $?"; cat $W/wj/whole_job.log | tail -12
timeout 240 $TG 20 1 4,12,16 > $W/suite.log 2>&1; echo "suite rc $? $(grep -c FAIL $W/suite.log) $(tail -1 $W/suite.log)"
grep -E "^part" $W/suite.log | tr '\n' ' '
cd $W && tar czf $OUT/run$RUN.tgz . && echo "total $(( $(date +%s) - t0 )) s"
