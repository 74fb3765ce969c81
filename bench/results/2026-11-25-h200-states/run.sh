#!/bin/bash
# device call: qk_gram_states on the GPU (tests/gpu/test_states_gpu.cpp), memcheck, bench, gpu_engine smoke
set -o pipefail
FINAL=${OUT:-/tmp/out}; OUT=/tmp/res; mkdir -p $OUT $FINAL
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
{
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; echo "commit $(cat .peer/commit)"
t0=$(date +%s)
meson setup bg -Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled >$OUT/setup.log 2>&1 && ninja -C bg tests/gpu/test_states_gpu tests/gpu/test_gpu_engine tests/core/test_states_in >$OUT/build.log 2>&1; echo "build rc $? $(( $(date +%s) - t0 )) s"; grep -E "error|warning" $OUT/build.log | head -20
bg/tests/core/test_states_in > $OUT/states_in.log 2>&1; echo "states_in rc $? $(tail -1 $OUT/states_in.log)"
timeout 300 bg/tests/gpu/test_states_gpu > $OUT/states_gpu.log 2>&1; echo "states_gpu rc $? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/states_gpu.log | head -30
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 bg/tests/gpu/test_states_gpu > $OUT/memcheck.log 2>&1; echo "memcheck rc $? $(grep -E 'ERROR SUMMARY|checks, ' $OUT/memcheck.log | tr '\n' ' ')"
timeout 200 bg/tests/gpu/test_states_gpu bench > $OUT/bench.log 2>&1; echo "bench rc $?"; cat $OUT/bench.log | grep bench
QK_TEST_SEED=$RANDOM timeout 200 bg/tests/gpu/test_gpu_engine 16 1 3,8,13 >$OUT/gpu_engine.log 2>&1; echo "gpu_engine rc $? : $(grep -E 'checks, ' $OUT/gpu_engine.log)"; grep -E "FAIL" $OUT/gpu_engine.log | head -5
echo "elapsed $(( $(date +%s) - t0 )) s"
} 2>&1 | tee $OUT/dev5.log
tar czf $FINAL/res.tgz -C /tmp res
