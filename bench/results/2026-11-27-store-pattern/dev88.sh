#!/bin/bash
# run 88/89: the final tree: issue 26's table (roof) with the peer in the same job; zz4 against
# 3fb9a98 (the old walk) alternated; the GPU suite at 4, 12, 16 qubits with the API tests
set -u
RUN=${RUN:-88}
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w$RUN; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
mkdir -p /tmp/base && tar xzf .peer/base-3fb9a98.tgz -C /tmp/base
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build-new.log 2>&1 &
(cd /tmp/base/base && meson setup /tmp/bb . $OPTS && ninja -C /tmp/bb bench/qk-bench) > $W/build-base.log 2>&1 &
wait
echo "builds $(( $(date +%s) - t0 )) s: $(tail -1 $W/build-new.log) / $(tail -1 $W/build-base.log)"
NB=/tmp/bn/bench/qk-bench; BB=/tmp/bb/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
B=/tmp/bn COMMIT=${COMMIT:-85ee83e} CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 300 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $?"; cat $W/roof/roofline.md 2>/dev/null | head -30
for r in 1 2 3; do
  timeout 60 $NB --cases zz4 > $W/zz-new-$r.log 2>&1; echo "new $r rc $? $(grep -E '^zz4 .*planned' $W/zz-new-$r.log | sed 's/ *| out.*//')"
  timeout 60 $BB --cases zz4 > $W/zz-base-$r.log 2>&1; echo "base $r rc $? $(grep -E '^zz4 .*planned' $W/zz-base-$r.log | sed 's/ *| out.*//')"
done
timeout 240 $TG 20 1 4,12,16 > $W/suite.log 2>&1; echo "suite rc $? $(grep -c FAIL $W/suite.log) $(tail -1 $W/suite.log)"
grep -E "^part" $W/suite.log | tr '\n' ' '
cd $W && tar czf $OUT/run$RUN.tgz . && echo "total $(( $(date +%s) - t0 )) s"
