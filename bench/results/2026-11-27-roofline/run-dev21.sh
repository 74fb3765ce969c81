#!/bin/bash
# device run 21: few-qubit tensor-core kernel with more blocks per SM (launch bounds 5 / 6 at D <= 16) against HEAD
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/o5 /tmp/o6 && tar -xf .peer/o5.tar -C /tmp/o5 && tar -xf .peer/o6.tar -C /tmp/o6
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( [ -f ba/build.ninja ] || meson setup ba $OPTS > /dev/null 2>&1; meson compile -C ba qk-bench > $OUT/l/build_a.log 2>&1; echo "HEAD build rc $?" ) &
for v in o5 o6; do ( cd /tmp/$v && meson setup b $OPTS > /dev/null 2>&1 && meson compile -C b qk-bench test_gpu_engine > $OUT/l/build_$v.log 2>&1; echo "$v build rc $?" ) & done
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
QA=$(find ba -name qk-bench -type f | head -1)
for r in 1 2; do for v in a o5 o6; do
  Q=$([ $v = a ] && echo $QA || find /tmp/$v/b -name qk-bench -type f | head -1)
  timeout 60 $Q --cases small --json $OUT/l/$v-$r.json > $OUT/l/$v-$r.log 2>&1; echo "$v r$r rc $?: $(grep -E 'write floor' $OUT/l/$v-$r.log | sed -E 's/.*= ([0-9]+ Gpairs).*/floor \1/') $(grep -E 'cfg=8 ' $OUT/l/$v-$r.log | grep Gpairs | sed -E 's/ +\| out.*//' | awk '{print $1, $(NF-1)}' | tr '\n' ' ')"
done; done
T=$(find /tmp/o5/b -name test_gpu_engine -type f | head -1); export QK_TEST_SEED=$RANDOM
timeout 120 $T 20 0 2,3,4 > $OUT/l/suite_o5.log 2>&1; echo "o5 suite rc $? seed $QK_TEST_SEED: $(tail -1 $OUT/l/suite_o5.log)"
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l && rm -rf l
