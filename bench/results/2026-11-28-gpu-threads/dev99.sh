#!/bin/bash
# run 99 (H200 x2): the final tree of stop 47 (a738843, "base") against HEAD + the structured pass's
# plane store as one loop a format ("new"): planes part, A/B at 12 and 16 q (16 q also under
# QK_STATES_OLD=1, the structured pass), then the 2-GPU rows and test_mgpu on "new"
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w99; mkdir -p $W /tmp/base
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar xzf .peer/base-a738843.tgz -C /tmp/base
(cd /tmp/base && meson setup /tmp/bb . $OPTS && ninja -C /tmp/bb bench/qk-bench) > $W/build-base.log 2>&1 &
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine bench/qk-mgpu-bench tests/gpu/test_mgpu) > $W/build-new.log 2>&1
echo "build new rc $? $(el) s"; wait; echo "build base $(el) s: $(tail -1 $W/build-base.log)"
TG=/tmp/bn/tests/gpu/test_gpu_engine
export CUDA_VISIBLE_DEVICES=0
QK_TEST_ONLY=planes timeout 150 $TG > $W/planes.log 2>&1; echo "planes rc $? $(tail -2 $W/planes.log | tr '\n' ' ') $(el) s"
grep -m6 FAIL $W/planes.log
for r in 1 2; do
  for t in new base; do
    B=/tmp/bn; [ $t = base ] && B=/tmp/bb
    timeout 90 $B/bench/qk-bench --cases roof12,roof16 > $W/roof-$t-$r.log 2>&1; echo "roof $t $r rc $? $(el) s"
    grep -E "^roof1[26] q=1[26]" $W/roof-$t-$r.log | grep -v "fp32 " | cut -c1-215
  done
done
for t in new base; do
  B=/tmp/bn; [ $t = base ] && B=/tmp/bb
  QK_STATES_OLD=1 timeout 90 $B/bench/qk-bench --cases roof16 > $W/roof16old-$t.log 2>&1; echo "roof16 QK_STATES_OLD $t rc $? $(el) s"
  grep -E "^roof16 q=16" $W/roof16old-$t.log | grep -v "fp32 " | cut -c1-215
done
unset CUDA_VISIBLE_DEVICES
MB=/tmp/bn/bench/qk-mgpu-bench
for r in 1 2; do
  for c in "auto 65536" "fp32 65536" "auto 32768" "fp32 32768"; do
    set -- $c
    for g in 0 0,1; do
      timeout 60 $MB --features 8 --n $2 --precision $1 --gpus $g --reps 9 --label "$1_$2_g$g" > $W/mgpu-$1-$2-$g-$r.log 2>&1
      echo "$r $1 n=$2 gpus=$g: $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$1-$2-$g-$r.log)"
    done
  done
done
echo "mgpu done $(el) s"
mkdir -p /tmp/qk_mgpu; timeout 150 /tmp/bn/tests/gpu/test_mgpu /tmp/qk_mgpu > $W/test_mgpu.log 2>&1; echo "test_mgpu rc $? $(tail -1 $W/test_mgpu.log)"
echo "total $(el) s"
cd $W && tar czf $OUT/run99.tgz .
