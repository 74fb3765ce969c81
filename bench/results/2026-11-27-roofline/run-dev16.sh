#!/bin/bash
# device run 16: smalltc through the tensor copy engine (TMA boxes): suite 2..6 q, memcheck/racecheck at 4 q,
# bench small,zz4 before (f239175) / after alternated, then the roof table with the peer (gpu-bench CASES=roof)
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
timeout 200 $TG 20 1 2,3,4,5,6 > $OUT/l/suite.log 2>&1; echo "suite rc $? seed $QK_TEST_SEED: $(tail -1 $OUT/l/suite.log)"
grep -m5 FAIL $OUT/l/suite.log
echo "suite done $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  timeout 100 $QA --cases small,zz4 --json $OUT/l/a$r.json > $OUT/l/a$r.log 2>&1; echo "after r$r rc $?"
  timeout 100 $QB --cases small,zz4 --json $OUT/l/b$r.json > $OUT/l/b$r.log 2>&1; echo "before r$r rc $?"
done
for f in a1 b1 a2 b2; do echo "== $f"; grep -E "write floor|Gpairs/s" $OUT/l/$f.log | grep -E "floor|planned|cfg=8" | sed -E "s/ +\| out.*//; s/ +device +/ /; s/ +gram +/ /"; done
echo "bench done $(( $(date +%s) - T0 )) s"
timeout 90 compute-sanitizer --tool memcheck --leak-check full $TG 20 0 4 > $OUT/l/memcheck.log 2>&1; echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' $OUT/l/memcheck.log | tail -1) $(tail -1 $OUT/l/memcheck.log)"
timeout 90 compute-sanitizer --tool racecheck $TG 20 0 3 > $OUT/l/racecheck.log 2>&1; echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY' $OUT/l/racecheck.log | tail -1) $(tail -1 $OUT/l/racecheck.log)"
echo "sanitizers done $(( $(date +%s) - T0 )) s"
B=ba CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 280 bash bench/run.sh gpu-bench $OUT/roof > $OUT/roof.txt 2>&1; echo "roof rc $?"
cat $OUT/roof/roofline.md; grep -E "roof floor|write floor" $OUT/roof.txt | head
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l roof roof.txt && rm -rf l roof
