#!/bin/bash
# run 87 (H100): the store-only probe; the warp-pipelined form forced (compact walk vs the skip walk) against the block form
# against 3fb9a98 (the skip walk), alternated; the small part of the GPU suite; memcheck, synccheck
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w87; mkdir -p $W
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
/tmp/probe4q 32768 > $W/probe4q.log 2>&1; echo "probe rc $?"; cat $W/probe4q.log
for r in 1 2 3; do
  timeout 60 $NB --cases zz4 > $W/zz-new-$r.log 2>&1; echo "new (block form) $r rc $?"; grep -E "^zz4 .*planned" $W/zz-new-$r.log
  QK_STC_WARP=1 timeout 60 $NB --cases zz4 > $W/zz-neww-$r.log 2>&1; echo "new warp form (compact walk) $r rc $?"; grep -E "^zz4 .*planned" $W/zz-neww-$r.log
  QK_STC_WARP=1 timeout 60 $BB --cases zz4 > $W/zz-basew-$r.log 2>&1; echo "base warp form (skip walk) $r rc $?"; grep -E "^zz4 .*planned" $W/zz-basew-$r.log
done
QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=small timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $TG > $W/memcheck.log 2>&1; echo "memcheck rc $? $(tail -2 $W/memcheck.log | tr '\n' ' ')"
QK_STC_WARP=1 QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=small timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $TG > $W/racecheck.log 2>&1; echo "racecheck (warp form forced) rc $? $(tail -2 $W/racecheck.log | tr '\n' ' ')"
cd $W && tar czf $OUT/run87.tgz . && echo "total $(( $(date +%s) - t0 )) s"
