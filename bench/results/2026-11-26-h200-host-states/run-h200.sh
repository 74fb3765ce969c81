#!/bin/bash
FINAL=${OUT:-/tmp/out}; R=/tmp/res; mkdir -p $R $FINAL
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PATH=$PATH:/tmp/ms/bin:/opt/torch/.venv/bin:/usr/local/cuda/bin PYTHONPATH=/tmp/ms QK_TEST_SEED=$RANDOM
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
fin() { echo "end $(el)" >> $R/head.txt; cat $R/head.txt; tar czf $FINAL/res.tgz -C /tmp res; }
trap fin EXIT
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nvcc --version | tail -2 | head -1; echo "commit $(cat .peer/commit) seed $QK_TEST_SEED"; } > $R/head.txt
G="-Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled -Dprofiler=false -Ddefault_targets=all"
( meson setup bn . $G > $R/b_new.log 2>&1; ninja -C bn tests/gpu/test_states_gpu tests/gpu/test_planner >> $R/b_new.log 2>&1; echo "new rc $?" >> $R/b_new.log )
echo "build $(el): $(tail -qn1 $R/b_new.log)" >> $R/head.txt
timeout 300 stdbuf -oL bn/tests/gpu/test_states_gpu > $R/states_gpu.log 2>&1; rc=$?; echo "states_gpu rc $rc $(el): $(grep -E 'checks, ' $R/states_gpu.log)" >> $R/head.txt
grep -E "FAIL|beyond memory" $R/states_gpu.log | head -12 >> $R/head.txt
[ $rc -ne 0 ] && tail -5 $R/states_gpu.log >> $R/head.txt

timeout 200 compute-sanitizer --tool memcheck --leak-check full bn/tests/gpu/test_states_gpu stream > $R/memcheck.log 2>&1; echo "memcheck rc $? $(el): $(grep -E 'ERROR SUMMARY|checks, ' $R/memcheck.log | tr '\n' ' ')" >> $R/head.txt
timeout 150 bn/tests/gpu/test_states_gpu bench-stream 14 32000 1.5 8192 > $R/bench_stream.log 2>&1; echo "bench-stream rc $? $(el)" >> $R/head.txt
grep -E "bench-stream" $R/bench_stream.log >> $R/head.txt
