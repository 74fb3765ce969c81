#!/bin/bash
# run 109 (H200 x2): a build without threads (QK_NO_THREADS) on two GPUs: test_mgpu, qk-mgpu-bench 1 / 2 GPUs
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
W=$OUT; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } | tee $W/gpu.txt
(meson setup /tmp/bt . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false -Dc_args=-DQK_NO_THREADS -Dcpp_args=-DQK_NO_THREADS && ninja -C /tmp/bt bench/qk-mgpu-bench tests/gpu/test_mgpu) > $W/build.log 2>&1
echo "build rc $? $(el) s"
grep -c "QK_NO_THREADS" /tmp/bt/build.ninja
mkdir -p /tmp/qk_mgpu; timeout 300 stdbuf -oL /tmp/bt/tests/gpu/test_mgpu /tmp/qk_mgpu > $W/test_mgpu-nothreads.log 2>&1; echo "test_mgpu (QK_NO_THREADS) rc $? $(tail -1 $W/test_mgpu-nothreads.log) $(el) s"
grep -m8 -i "fail" $W/test_mgpu-nothreads.log
for g in 0 0,1 0 0,1; do
  timeout 60 /tmp/bt/bench/qk-mgpu-bench --features 8 --n 32768 --precision auto --gpus $g --reps 9 --label "nt_g$g" > $W/mgpu-$g.log 2>&1
  echo "no threads, gpus $g: rc $? $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$g.log)"
done
for o in host npy; do
  timeout 60 /tmp/bt/bench/qk-mgpu-bench --features 8 --n 32768 --precision auto --gpus 0,1 --reps 3 --output $o --label "nt_$o" > $W/mgpu-$o.log 2>&1
  echo "no threads, 2 GPUs, output $o: rc $? $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$o.log)"
done
echo "total $(el) s"
