#!/bin/bash
# run 93: operand planes from the state builder, fp16 / bf16 / fp32x3: tests, a mutant, sanitizers, A/B, suite at 14 and 16
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w93; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine qk-gram) > $W/build.log 2>&1
echo "build rc $? $(( $(date +%s) - t0 )) s"; tail -1 $W/build.log
# the mutant: Gauss's third B plane from re - im instead of re + im (planes path only)
mkdir -p /tmp/mut && tar --exclude=./.peer --exclude=./.git --exclude=./build-cu --exclude=./build-me -cf - . | tar -xf - -C /tmp/mut
sed -i 's|pb\[2\] = (const char \*)B + (size_t)(3 \* pp->psb) \* vb;|pb[2] = (const char *)B + (size_t)(2 * pp->psb) * vb;|' /tmp/mut/qk_cuda.cu
grep -c "2 \* pp->psb" /tmp/mut/qk_cuda.cu
(cd /tmp/mut && meson setup /tmp/bm . $OPTS && ninja -C /tmp/bm tests/gpu/test_gpu_engine) > $W/build-mut.log 2>&1 &
NB=/tmp/bn/bench/qk-bench; TG=/tmp/bn/tests/gpu/test_gpu_engine
QK_TEST_ONLY=planes timeout 200 $TG > $W/planes.log 2>&1; echo "planes rc $? $(grep -c FAIL $W/planes.log) $(tail -2 $W/planes.log | tr '\n' ' ')"
grep -m5 -E "FAIL|off \(" $W/planes.log
QK_TEST_ONLY=tcblocks timeout 200 $TG > $W/tcblocks.log 2>&1; echo "tcblocks rc $? $(tail -1 $W/tcblocks.log)"
wait; echo "mutant build: $(tail -1 $W/build-mut.log)"
QK_TEST_ONLY=planes timeout 200 /tmp/bm/tests/gpu/test_gpu_engine > $W/planes-mut.log 2>&1; echo "mutant planes rc $? $(tail -2 $W/planes-mut.log | tr '\n' ' ')"
grep -m3 FAIL $W/planes-mut.log
for r in 1 2; do
  for v in on off; do
    if [ $v = off ]; then export QK_TC_PLANES=0; else unset QK_TC_PLANES; fi
    timeout 120 $NB --cases roof16 --json $W/roof16-$v-$r.json > $W/roof16-$v-$r.log 2>&1; echo "roof16 $v $r rc $?"
    grep -E "^roof16 q=16" $W/roof16-$v-$r.log | grep -v "fp32 "
  done
done
unset QK_TC_PLANES
QK_TEST_ONLY=planes timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $TG > $W/memcheck.log 2>&1; echo "memcheck rc $? $(tail -2 $W/memcheck.log | tr '\n' ' ')"
QK_TEST_POISON=1 QK_TEST_UNDER_SANITIZER=1 QK_TEST_ONLY=planes timeout 300 compute-sanitizer --tool initcheck --error-exitcode 9 $TG > $W/initcheck.log 2>&1; echo "initcheck rc $? $(tail -2 $W/initcheck.log | tr '\n' ' ')"
echo "before suite $(( $(date +%s) - t0 )) s"
timeout $(( 560 - ($(date +%s) - t0) )) $TG 20 1 14,16 > $W/suite.log 2>&1; echo "suite rc $? $(grep -c FAIL $W/suite.log) $(tail -1 $W/suite.log)"; grep -E "^part" $W/suite.log | tr '\n' ' '
echo "total $(( $(date +%s) - t0 )) s"
cd $W && tar czf $OUT/run93.tgz .
