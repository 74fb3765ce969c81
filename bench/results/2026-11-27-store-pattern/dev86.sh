#!/bin/bash
# run 86: the 4-qubit warp-pipelined kernel over a numbering of the triangle's tiles (no skipped tiles)
# against 3fb9a98 (the skip walk), alternated; the small part of the GPU suite; memcheck, synccheck
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w86; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
mkdir -p /tmp/base && tar xzf .peer/base-3fb9a98.tgz -C /tmp/base
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build-new.log 2>&1 &
(cd /tmp/base/base && meson setup /tmp/bb . $OPTS && ninja -C /tmp/bb bench/qk-bench) > $W/build-base.log 2>&1 &
nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/probe4q .peer/probe4q.cu > $W/probe-build.log 2>&1
wait
echo "builds $(( $(date +%s) - t0 )) s: $(tail -1 $W/build-new.log) / $(tail -1 $W/build-base.log)"
for f in /tmp/bn /tmp/bb; do O=$(find $f -name "*qk_cuda.cu.o" | head -1); echo "$f: $(cuobjdump -res-usage $O 2>/dev/null | grep -A1 gram_stw | tail -1)"; done
NB=/tmp/bn/bench/qk-bench; BB=/tmp/bb/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
QK_TEST_ONLY=small timeout 200 $TG > $W/small.log 2>&1; echo "small rc $? $(grep -c FAIL $W/small.log) $(tail -1 $W/small.log)"
for r in 1 2; do
  timeout 60 $NB --cases zz2,zz3,zz4 > $W/zz-new-$r.log 2>&1; echo "new $r rc $?"; grep -E "^zz[234] .*planned" $W/zz-new-$r.log
  timeout 60 $BB --cases zz2,zz3,zz4 > $W/zz-base-$r.log 2>&1; echo "base $r rc $?"; grep -E "^zz[234] .*planned" $W/zz-base-$r.log
  QK_STC_OLD=1 timeout 60 $NB --cases zz4 > $W/zz-old-$r.log 2>&1; echo "block form $r rc $?"; grep -E "^zz4 .*planned" $W/zz-old-$r.log
done
/tmp/probe4q 32768 2>&1 | grep -E "memset|stw tile|list rows" | head -6 | tee $W/probe.log
QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=small timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $TG > $W/memcheck.log 2>&1; echo "memcheck rc $? $(tail -2 $W/memcheck.log | tr '\n' ' ')"
QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=small timeout 150 compute-sanitizer --tool synccheck --error-exitcode 9 $TG > $W/synccheck.log 2>&1; echo "synccheck rc $? $(tail -2 $W/synccheck.log | tr '\n' ' ')"
cd $W && tar czf $OUT/run86.tgz . && echo "total $(( $(date +%s) - t0 )) s"
