#!/bin/bash
# run 92: the state builder writes the fp16 / bf16 operand planes (16 q fp16): tests, sanitizers, A/B
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w92; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine qk-gram) > $W/build.log 2>&1
echo "build rc $? $(( $(date +%s) - t0 )) s"; tail -1 $W/build.log
NB=/tmp/bn/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
QK_TEST_ONLY=planes timeout 200 $TG > $W/planes.log 2>&1; echo "planes rc $? $(grep -c FAIL $W/planes.log) $(tail -2 $W/planes.log | tr '\n' ' ')"
grep -m5 -E "FAIL|off \(" $W/planes.log
QK_TEST_ONLY=tcblocks timeout 200 $TG > $W/tcblocks.log 2>&1; echo "tcblocks rc $? $(tail -1 $W/tcblocks.log)"
for r in 1 2; do
  for v in on off; do
    if [ $v = off ]; then export QK_TC_PLANES=0; else unset QK_TC_PLANES; fi
    timeout 120 $NB --cases roof16 --json $W/roof16-$v-$r.json > $W/roof16-$v-$r.log 2>&1; echo "roof16 $v $r rc $?"
    grep -E "^roof +16 q" $W/roof16-$v-$r.log
    grep -E "^roof16 q=16" $W/roof16-$v-$r.log
  done
done
unset QK_TC_PLANES
timeout 100 python3 .peer/torch_qk.py --cases zz:16:4096 --json $W/peer.json > $W/peer.log 2>&1; echo "peer rc $?"; tail -3 $W/peer.log
QK_TEST_ONLY=planes timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $TG > $W/memcheck.log 2>&1; echo "memcheck rc $? $(tail -2 $W/memcheck.log | tr '\n' ' ')"
QK_TEST_POISON=1 QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=planes timeout 200 compute-sanitizer --tool initcheck --error-exitcode 9 $TG > $W/initcheck.log 2>&1; echo "initcheck rc $? $(tail -2 $W/initcheck.log | tr '\n' ' ')"
echo "total $(( $(date +%s) - t0 )) s"
cd $W && tar czf $OUT/run92.tgz .
