#!/bin/bash
# device run 01: density matrices on the tensor cores, pure device side vs device matrices
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
R=$OUT/r; mkdir -p $R
git rev-parse HEAD > $R/commit 2>/dev/null; cat .peer/commit >> $R/commit 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
nvcc --version | tail -2 >> $R/gpu.txt
python3 -m mesonbuild.mesonmain setup b -Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled -Dprofiler=false > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
ninja -C b tests/gpu/test_states_gpu tests/gpu/test_planner > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
./b/tests/gpu/test_planner > $R/planner.log 2>&1; echo "planner rc $?"; tail -1 $R/planner.log
./b/tests/gpu/test_states_gpu > $R/states_gpu.log 2>&1; echo "states_gpu rc $?"; grep -E "FAIL|checks" $R/states_gpu.log | head -30
grep "err " $R/states_gpu.log | head -60 > $R/errs.txt
compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 ./b/tests/gpu/test_states_gpu stream > $R/memcheck.log 2>&1; echo "memcheck rc $?"; tail -3 $R/memcheck.log
./b/tests/gpu/test_states_gpu bench-mixed > $R/bench_mixed.log 2>&1; echo "bench rc $?"; cat $R/bench_mixed.log | cut -c1-260
cd $OUT && tar czf res.tgz r && rm -rf r
