#!/bin/bash
# run 83: the store-only probe of the 4-qubit Gram's pattern; g3 passed down (tcblocks, 12 q suite);
# issue 26's table (roof) with the peer in the same job, on the final tree
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w83; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; git rev-parse HEAD 2>/dev/null; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine tests/gpu/test_planner) > $W/build.log 2>&1 &
nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/probe4q .peer/probe4q.cu > $W/probe-build.log 2>&1
/tmp/probe4q 32768 > $W/probe4q.log 2>&1; echo "probe rc $?"; cat $W/probe4q.log
wait
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $W/build.log)"
TG=/tmp/bn/tests/gpu/test_gpu_engine
/tmp/bn/tests/gpu/test_planner > $W/test_planner.log 2>&1; echo "planner rc $? $(tail -1 $W/test_planner.log)"
QK_TEST_ONLY=tcblocks timeout 200 $TG > $W/tcblocks.log 2>&1; echo "tcblocks rc $? $(grep -c FAIL $W/tcblocks.log) $(tail -1 $W/tcblocks.log)"
B=/tmp/bn CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 420 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $?"; grep -E "^roof|floor" $W/roof/bench.log | head -30; tail -8 $W/roof/peer.log; cat $W/roof/roofline.md 2>/dev/null | head -40
cd $W && tar czf $OUT/run83.tgz . && echo "total $(( $(date +%s) - t0 )) s"
