#!/bin/bash
# run 102 (H200 x2): where a 2-GPU call's time goes outside the first GPU's events (HEAD, profiler build)
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
W=/tmp/w102; mkdir -p $W
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
(meson setup /tmp/bp . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=true && ninja -C /tmp/bp bench/qk-mgpu-bench-prof) > $W/build.log 2>&1
echo "build rc $? $(el) s"; tail -1 $W/build.log
MB=/tmp/bp/bench/qk-mgpu-bench-prof
for g in 0 0,1; do
  timeout 60 $MB --features 8 --n 32768 --precision auto --gpus $g --reps 9 --label "g$g" --trace $W/trace-$g.json > $W/prof-$g.log 2>&1
  echo "gpus $g rc $?: $(grep -o '"median_s": [0-9.e-]*' $W/prof-$g.log)"
done
echo "total $(el) s"
cd $W && tar czf $OUT/run102.tgz .
