#!/bin/bash
FINAL=${OUT:-/tmp/out}; R=/tmp/res; mkdir -p $R $FINAL
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PATH=$PATH:/tmp/ms/bin:/opt/torch/.venv/bin:/usr/local/cuda/bin PYTHONPATH=/tmp/ms QK_TEST_SEED=$RANDOM
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
fin() { echo "end $(el)" >> $R/head.txt; cat $R/head.txt; tar czf $FINAL/res.tgz -C /tmp res; }
trap fin EXIT
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; echo "commit $(cat .peer/commit) seed $QK_TEST_SEED"; } > $R/head.txt
G="-Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled -Dprofiler=false -Ddefault_targets=all -Dmpi=enabled"
( meson setup bn . $G > $R/b_new.log 2>&1; ninja -C bn tests/gpu/test_mgpu tests/mpi/test_states_gpu_mpi >> $R/b_new.log 2>&1; echo "new rc $?" >> $R/b_new.log )
echo "build $(el): $(tail -qn1 $R/b_new.log)" >> $R/head.txt
timeout 200 meson test -C bn states_gpu_mpi --print-errorlogs > $R/sgm.log 2>&1; echo "states_gpu_mpi rc $? $(el): $(grep -E '^Ok:|^Fail:' $R/sgm.log | tr '\n' ' ')" >> $R/head.txt
grep -E "test_states_gpu_mpi: .* checks" bn/meson-logs/testlog.txt | head -8 >> $R/head.txt
timeout 200 bn/tests/gpu/test_mgpu > $R/mgpu.log 2>&1; echo "mgpu rc $? $(el): $(grep -E 'checks, ' $R/mgpu.log)" >> $R/head.txt
grep -E "FAIL" $R/mgpu.log | head -5 >> $R/head.txt
