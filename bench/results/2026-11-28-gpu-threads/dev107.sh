#!/bin/bash
# run 107 (H200 x2): HEAD (the pools started by one routine; a forked child's own pool): qk-mgpu-bench 1 / 2 GPUs, test_mgpu
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
W=$OUT; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
(meson setup /tmp/bh . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false && ninja -C /tmp/bh bench/qk-mgpu-bench tests/gpu/test_mgpu) > $W/build.log 2>&1
echo "build rc $? $(el) s"
for g in 0 0,1 0 0,1; do
  timeout 30 /tmp/bh/bench/qk-mgpu-bench --features 8 --n 32768 --precision auto --gpus $g --reps 15 --label "g$g" > $W/mgpu-$g.log 2>&1
  echo "gpus $g: $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$g.log)"
done
mkdir -p /tmp/qk_mgpu; timeout 120 stdbuf -oL /tmp/bh/tests/gpu/test_mgpu /tmp/qk_mgpu > $W/test_mgpu.log 2>&1; echo "test_mgpu rc $? $(tail -1 $W/test_mgpu.log) $(el) s"
