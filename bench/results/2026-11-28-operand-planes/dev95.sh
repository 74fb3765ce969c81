#!/bin/bash
# run 95 (H100): the tree with the state builder's operand planes (e7a9b73): planes test, A/B at 16 q,
# issue 26's table (roof) with the peer in the same job
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w95; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine qk-gram) > $W/build-new.log 2>&1
echo "build $(( $(date +%s) - t0 )) s: $(tail -1 $W/build-new.log)"
NB=/tmp/bn/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
QK_TEST_ONLY=planes timeout 200 $TG > $W/planes.log 2>&1; echo "planes rc $? $(tail -2 $W/planes.log | tr '\n' ' ')"
for v in on off on off; do
  if [ $v = off ]; then export QK_TC_PLANES=0; else unset QK_TC_PLANES; fi
  timeout 120 $NB --cases roof16 > $W/roof16-$v.log 2>&1; echo "roof16 $v rc $?"
  grep -E "^roof16 q=16" $W/roof16-$v.log | grep -v "fp32 " | cut -c1-200
  mv $W/roof16-$v.log $W/roof16-$v-$(date +%s).log
done
unset QK_TC_PLANES
B=/tmp/bn COMMIT=e7a9b73 CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 330 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $?"; cat $W/roof/roofline.md 2>/dev/null | head -30
cd $W && tar czf $OUT/run95.tgz . && echo "total $(( $(date +%s) - t0 )) s"
