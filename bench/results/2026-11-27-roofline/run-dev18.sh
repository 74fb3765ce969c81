#!/bin/bash
# device run 18: smalltc rows split once in shared memory + folded epilogue scale: suite 2..6 q, sanitizers on a
# 4-qubit qk-gram job, bench small,zz4 before (HEAD) / after alternated
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/before && tar -xf .peer/before.tar -C /tmp/before
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( meson setup ba $OPTS > /dev/null 2>&1 && meson compile -C ba qk-bench test_gpu_engine qk-gram > $OUT/l/build_a.log 2>&1; echo "after build rc $?" ) &
( cd /tmp/before && meson setup bb $OPTS > /dev/null 2>&1 && meson compile -C bb qk-bench qk-gram > $OUT/l/build_b.log 2>&1; echo "before build rc $?" ) &
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TG=$(find ba -name test_gpu_engine -type f | head -1); QA=$(find ba -name qk-bench -type f | head -1); QB=$(find /tmp/before/bb -name qk-bench -type f | head -1)
GA=$(find ba -name qk-gram -type f | head -1); GB=$(find /tmp/before/bb -name qk-gram -type f | head -1)
export QK_TEST_SEED=$RANDOM
timeout 200 $TG 20 1 2,3,4,5,6 > $OUT/l/suite.log 2>&1; echo "suite rc $? seed $QK_TEST_SEED: $(tail -1 $OUT/l/suite.log)"
grep -m5 FAIL $OUT/l/suite.log
echo "suite done $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  timeout 60 $QA --cases small,zz4 --json $OUT/l/a$r.json > $OUT/l/a$r.log 2>&1; echo "after r$r rc $?"
  timeout 60 $QB --cases small,zz4 --json $OUT/l/b$r.json > $OUT/l/b$r.log 2>&1; echo "before r$r rc $?"
done
for f in a1 b1 a2 b2; do echo "== $f"; grep -E "write floor|Gpairs/s" $OUT/l/$f.log | grep -E "floor|planned|cfg=8" | grep -v "cublas" | sed -E "s/ +\| out.*//; s/ +device +/ /; s/ +gram +/ /"; done
for f in a1 b1; do grep -A1 "small4.*cfg=8" $OUT/l/$f.log | grep -- "->"; done
echo "bench done $(( $(date +%s) - T0 )) s"
for q in 3 4 6; do python3 -c "import numpy as np; np.save('/tmp/X$q.npy', np.random.default_rng($q).uniform(0, 6.28, (3000, $q)))"; done
for q in 3 4 6; do
  $GA --map "zz(reps=2)" --x /tmp/X$q.npy --out /tmp/Ka$q.npy --device cuda > /dev/null 2>&1; $GB --map "zz(reps=2)" --x /tmp/X$q.npy --out /tmp/Kb$q.npy --device cuda > /dev/null 2>&1
  python3 -c "import numpy as np; a=np.load('/tmp/Ka$q.npy'); b=np.load('/tmp/Kb$q.npy'); print('q=$q K after vs before: max |diff| %.3g, bitwise equal %s, symmetric %s' % (abs(a-b).max(), bool((a==b).all()), bool((a==a.T).all())))"
done
timeout 90 compute-sanitizer --tool memcheck --leak-check full $GA --map "zz(reps=2)" --x /tmp/X4.npy --out /tmp/Km.npy --device cuda > $OUT/l/memcheck.log 2>&1; echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' $OUT/l/memcheck.log | tail -1)"
timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard $GA --map "zz(reps=2)" --x /tmp/X4.npy --out /tmp/Kr.npy --device cuda > $OUT/l/racecheck.log 2>&1; echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY' $OUT/l/racecheck.log | tail -1)"
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l && rm -rf l
