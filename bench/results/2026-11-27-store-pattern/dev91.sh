#!/bin/bash
# run 91: qk_cuda_device_query reads a device's fixed properties once (qk_plan_make asks every call):
# qk_plan_make's time and the call's, 1 GPU, against 3fb9a98 alternated; the GPU suite at 3 qubits
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w91; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
mkdir -p /tmp/base && tar xzf .peer/base-3fb9a98.tgz -C /tmp/base
t0=$(date +%s)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-mgpu-bench tests/gpu/test_gpu_engine) > $W/build-new.log 2>&1 &
(cd /tmp/base/base && meson setup /tmp/bb . $OPTS && ninja -C /tmp/bb bench/qk-mgpu-bench) > $W/build-base.log 2>&1 &
wait
echo "builds $(( $(date +%s) - t0 )) s: $(tail -1 $W/build-new.log) / $(tail -1 $W/build-base.log)"
for r in 1 2 3; do
  for t in new base; do
    B=/tmp/bn; [ $t = base ] && B=/tmp/bb
    for c in "8 32768" "4 2048" "8 1024"; do set -- $c
      timeout 60 $B/bench/qk-mgpu-bench --features $1 --n $2 --gpus 0 > $W/mgpu-$t-$1-$2-$r.log 2>&1
      echo "$t r$r f$1 n$2 rc $?: $(grep -E '^qk_plan_make' $W/mgpu-$t-$1-$2-$r.log) | $(grep -oE 'median [0-9.]+ s of [0-9]+' $W/mgpu-$t-$1-$2-$r.log | tail -1)"
    done
  done
done
timeout 200 /tmp/bn/tests/gpu/test_gpu_engine 20 1 3 > $W/suite3.log 2>&1; echo "suite rc $? $(grep -c FAIL $W/suite3.log) $(tail -1 $W/suite3.log)"
cd $W && tar czf $OUT/run91.tgz . && echo "total $(( $(date +%s) - t0 )) s"
