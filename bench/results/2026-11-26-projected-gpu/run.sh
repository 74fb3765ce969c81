#!/bin/bash
# device run 04: the projected kernel's GPU engine (merged helper), the live-bytes leak checks, the GPU suite under concurrency
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
R=$OUT/r; mkdir -p $R
cat .peer/commit > $R/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt; nvcc --version | tail -2 >> $R/gpu.txt
python3 -m mesonbuild.mesonmain setup b -Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled -Dprofiler=false > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
ninja -C b tests/gpu/test_projected_gpu tests/gpu/test_vjp_gpu tests/gpu/test_gpu_engine tests/gpu/test_states_gpu tests/gpu/test_mps_gpu tests/gpu/test_mps_states_gpu examples/sim_states tests/gpu/test_planner > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
echo "== projected_gpu"; timeout 200 ./b/tests/gpu/test_projected_gpu > $R/projected_gpu.log 2>&1; echo "rc $?"; grep -E "FAIL|checks" $R/projected_gpu.log | head -30
echo "== projected bench"; timeout 150 ./b/tests/gpu/test_projected_gpu bench > $R/projected_bench.log 2>&1; echo "rc $?"; tail -8 $R/projected_bench.log
echo "== memcheck projected"; timeout 200 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 ./b/tests/gpu/test_projected_gpu > $R/projected_memcheck.log 2>&1; echo "rc $?"; tail -3 $R/projected_memcheck.log
echo "== suite (3 at once)"; timeout 240 python3 -m mesonbuild.mesonmain test -C b --no-rebuild --num-processes 3 projected_gpu vjp_gpu gpu_engine states_gpu mps_gpu mps_states_gpu sim-states planner > $R/suite.log 2>&1; echo "rc $?"; grep -E "^ *[0-9]+/[0-9]+ " $R/suite.log
cp b/meson-logs/testlog.txt $R/suite_testlog.txt
cd $OUT && tar czf res.tgz r && rm -rf r
