#!/bin/bash
# device run 15: deferred epilogue (wg16p) + bulk-store smalltc: suite 2..8 q, sanitizers, bench before (f239175) / after
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/before && tar -xf .peer/before.tar -C /tmp/before
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( meson setup ba $OPTS > /dev/null 2>&1 && meson compile -C ba qk-bench test_gpu_engine > $OUT/l/build_a.log 2>&1; echo "after build rc $?" ) &
( cd /tmp/before && meson setup bb $OPTS > /dev/null 2>&1 && meson compile -C bb qk-bench > $OUT/l/build_b.log 2>&1; echo "before build rc $?" ) &
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TG=$(find ba -name test_gpu_engine -type f | head -1); QA=$(find ba -name qk-bench -type f | head -1); QB=$(find /tmp/before/bb -name qk-bench -type f | head -1)
export QK_TEST_SEED=$RANDOM
timeout 240 $TG 20 1 2,3,4,5,6,7,8 > $OUT/l/suite.log 2>&1; echo "suite rc $? seed $QK_TEST_SEED: $(tail -2 $OUT/l/suite.log | tr '\n' ' ')"
grep -m5 FAIL $OUT/l/suite.log
echo "suite done $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  timeout 150 $QA --cases small,zz4,tc7,tc8 --json $OUT/l/a$r.json > $OUT/l/a$r.log 2>&1; echo "after r$r rc $?"
  timeout 150 $QB --cases small,zz4,tc7,tc8 --json $OUT/l/b$r.json > $OUT/l/b$r.log 2>&1; echo "before r$r rc $?"
done
for f in a1 b1 a2 b2; do echo "== $f"; grep -E "write floor|Gpairs/s" $OUT/l/$f.log | grep -E "floor|small|zz4|fp16|fp32x3" | sed -E "s/ +\| out.*//; s/ +device +/ /; s/ +gram +/ /"; done
echo "bench done $(( $(date +%s) - T0 )) s"
timeout 150 compute-sanitizer --tool memcheck --leak-check full $TG 20 0 2,4,8 > $OUT/l/memcheck.log 2>&1; echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' $OUT/l/memcheck.log | tail -1)"
timeout 150 compute-sanitizer --tool racecheck $TG 20 0 4 > $OUT/l/racecheck.log 2>&1; echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|hazard' $OUT/l/racecheck.log | tail -2)"
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l && rm -rf l
