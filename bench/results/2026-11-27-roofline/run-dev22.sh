#!/bin/bash
# device run 22: persistent fp16 wgmma kernel with one stage's products in flight (wait_group 1, two A register sets,
# 5-slot ring): suite at 7, 8 q; K of qk-gram fp16 (the persistent kernel: K resident) before / after bitwise; racecheck,
# memcheck of that job; bench tc7,tc8 before (HEAD) / after alternated
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/before && tar -xf .peer/before.tar -C /tmp/before
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( meson setup ba $OPTS > /dev/null 2>&1; meson compile -C ba qk-bench test_gpu_engine qk-gram > $OUT/l/build_a.log 2>&1; echo "after build rc $?" ) &
( cd /tmp/before && meson setup bb $OPTS > /dev/null 2>&1 && meson compile -C bb qk-bench qk-gram > $OUT/l/build_b.log 2>&1; echo "before build rc $?" ) &
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TG=$(find ba -name test_gpu_engine -type f | head -1); QA=$(find ba -name qk-bench -type f | head -1); QB=$(find /tmp/before/bb -name qk-bench -type f | head -1)
GA=$(find ba -name qk-gram -type f | head -1); GB=$(find /tmp/before/bb -name qk-gram -type f | head -1)
for r in 1 2; do
  timeout 80 $QA --cases tc7,tc8 > $OUT/l/a$r.log 2>&1; echo "after r$r rc $?: $(grep -E 'fp16 +device +tcf-fp16 .*cfg=4' $OUT/l/a$r.log | sed -E 's/ +\| out.*//' | awk '{print $1, $(NF-1)}' | tr '\n' ' ')"
  timeout 80 $QB --cases tc7,tc8 > $OUT/l/b$r.log 2>&1; echo "before r$r rc $?: $(grep -E 'fp16 +device +tcf-fp16 .*cfg=4' $OUT/l/b$r.log | sed -E 's/ +\| out.*//' | awk '{print $1, $(NF-1)}' | tr '\n' ' ')"
done
grep -A1 -E "tc8 .*fp16 +device +tcf-fp16 .*cfg=4" $OUT/l/a1.log $OUT/l/b1.log | grep -- "->"
echo "bench done $(( $(date +%s) - T0 )) s"
export QK_TEST_SEED=$RANDOM
timeout 150 $TG 20 0 7,8 > $OUT/l/suite.log 2>&1; echo "suite rc $? seed $QK_TEST_SEED: $(tail -1 $OUT/l/suite.log)"
grep -m5 FAIL $OUT/l/suite.log
for q in 7 8; do python3 -c "import numpy as np; np.save('/tmp/X$q.npy', np.random.default_rng($q).uniform(0, 6.28, (3000, $q)))"
  $GA --map "zz(reps=2)" --x /tmp/X$q.npy --out /tmp/Ka$q.npy --device cuda --precision fp16 > $OUT/l/gram_a$q.log 2>&1; $GB --map "zz(reps=2)" --x /tmp/X$q.npy --out /tmp/Kb$q.npy --device cuda --precision fp16 > /dev/null 2>&1
  python3 -c "import numpy as np; a=np.load('/tmp/Ka$q.npy'); b=np.load('/tmp/Kb$q.npy'); print('q=$q fp16 K after vs before: max |diff| %.3g, bitwise equal %s, symmetric %s' % (abs(a-b).max(), bool((a==b).all()), bool((a==a.T).all())))"
  grep -m2 -i "engine\|config" $OUT/l/gram_a$q.log
done
python3 -c "import numpy as np; np.save('/tmp/Xs.npy', np.random.default_rng(5).uniform(0, 6.28, (1500, 8)))"
timeout 120 compute-sanitizer --tool racecheck $GA --map "zz(reps=2)" --x /tmp/Xs.npy --out /tmp/Kr.npy --device cuda --precision fp16 > $OUT/l/racecheck.log 2>&1; echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY' $OUT/l/racecheck.log | tail -1)"
timeout 90 compute-sanitizer --tool memcheck $GA --map "zz(reps=2)" --x /tmp/Xs.npy --out /tmp/Km.npy --device cuda --precision fp16 > $OUT/l/memcheck.log 2>&1; echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' $OUT/l/memcheck.log | tail -1)"
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l && rm -rf l
