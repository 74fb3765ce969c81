#!/bin/bash
# run 97: operand planes from every state builder (HEAD): tests, A/B at 12 and 16 q, maps, memcheck
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w97; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build.log 2>&1
echo "build rc $? $(el) s"; tail -1 $W/build.log
NB=/tmp/bn/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
QK_TEST_ONLY=planes timeout 150 $TG > $W/planes.log 2>&1; echo "planes rc $? $(tail -2 $W/planes.log | tr '\n' ' ') $(el) s"
grep -m6 FAIL $W/planes.log
QK_TEST_ONLY=tcblocks timeout 100 $TG > $W/tcblocks.log 2>&1; echo "tcblocks rc $? $(tail -1 $W/tcblocks.log) $(el) s"
for v in on off; do
  if [ $v = off ]; then export QK_TC_PLANES=0; else unset QK_TC_PLANES; fi
  timeout 90 $NB --cases roof12,roof16 > $W/roof-$v.log 2>&1; echo "roof $v rc $? $(el) s"
  grep -E "^roof1[26] q=1[26]" $W/roof-$v.log | grep -v "fp32 " | cut -c1-215
done
unset QK_TC_PLANES
QK_TEST_ONLY=maps timeout 90 $TG 20 1 8,12 > $W/maps.log 2>&1; echo "maps 8,12 rc $? $(tail -1 $W/maps.log) $(el) s"
left=$(( 440 - $(el) ))
if [ $left -gt 40 ]; then
  QK_TEST_ONLY=planes timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 $TG > $W/memcheck.log 2>&1; echo "memcheck planes rc $? $(tail -2 $W/memcheck.log | tr '\n' ' ')"
fi
echo "total $(el) s"
cd $W && tar czf $OUT/run97.tgz .
