#!/bin/bash
# run 103 (H200 x2): the GPU pool's caller yields before it sleeps (working tree, "spin") against the pool
# alone (5aa3040, "pool") and a thread per GPU and call (5f3a40c, "base"), alternated; test_mgpu; a trace
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w103; mkdir -p $W /tmp/s_base /tmp/s_pool
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar xzf .peer/base-5f3a40c.tgz -C /tmp/s_base; tar xzf .peer/base-5aa3040.tgz -C /tmp/s_pool
(cd /tmp/s_base && meson setup /tmp/b_base . $OPTS && ninja -C /tmp/b_base bench/qk-mgpu-bench) > $W/build-base.log 2>&1 &
(cd /tmp/s_pool && meson setup /tmp/b_pool . $OPTS && ninja -C /tmp/b_pool bench/qk-mgpu-bench) > $W/build-pool.log 2>&1 &
(meson setup /tmp/b_spin . $OPTS && ninja -C /tmp/b_spin bench/qk-mgpu-bench tests/gpu/test_mgpu) > $W/build-spin.log 2>&1 &
(meson setup /tmp/bp2 . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=true && ninja -C /tmp/bp2 bench/qk-mgpu-bench-prof) > $W/build-prof.log 2>&1 &
wait; echo "builds $(el) s: $(tail -qn1 $W/build-*.log | tr '\n' ' ')"
for r in 1 2 3; do
  for t in spin pool base; do
    MB=/tmp/b_$t/bench/qk-mgpu-bench
    line="$r $t:"
    for c in "auto 32768" "fp32 32768"; do
      set -- $c
      for g in 0 0,1; do
        timeout 60 $MB --features 8 --n $2 --precision $1 --gpus $g --reps 21 --label "$1_$2_g$g" > $W/mgpu-$t-$1-$2-$g-$r.log 2>&1
        line="$line $1/$2/g$g $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$t-$1-$2-$g-$r.log | cut -d' ' -f2)"
      done
    done
    echo "$line"
  done
done
echo "A/B $(el) s"
timeout 60 /tmp/bp2/bench/qk-mgpu-bench-prof --features 8 --n 32768 --precision auto --gpus 0,1 --reps 9 --label prof --trace $W/trace-spin-2gpu.json > $W/prof-spin.log 2>&1; echo "trace rc $?"
mkdir -p /tmp/qk_mgpu; timeout 150 /tmp/b_spin/tests/gpu/test_mgpu /tmp/qk_mgpu > $W/test_mgpu.log 2>&1; echo "test_mgpu rc $? $(tail -1 $W/test_mgpu.log) $(el) s"
echo "total $(el) s"
cd $W && tar czf $OUT/run103.tgz .
