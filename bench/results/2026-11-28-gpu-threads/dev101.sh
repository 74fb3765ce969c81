#!/bin/bash
# run 101 (H200 x2): the GPUs' host threads from the context's pool (HEAD, "new") against a thread per
# GPU and call (5f3a40c, "base"): qk-mgpu-bench 1 and 2 GPUs alternated, test_mgpu, memcheck
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w101; mkdir -p $W /tmp/base2
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar xzf .peer/base-5f3a40c.tgz -C /tmp/base2
(cd /tmp/base2 && meson setup /tmp/bb2 . $OPTS && ninja -C /tmp/bb2 bench/qk-mgpu-bench) > $W/build-base.log 2>&1 &
(meson setup /tmp/bn1 . $OPTS && ninja -C /tmp/bn1 bench/qk-mgpu-bench tests/gpu/test_mgpu) > $W/build-new.log 2>&1
echo "build new rc $? $(el) s"; wait; echo "build base $(el) s: $(tail -1 $W/build-base.log)"
for r in 1 2 3; do
  for t in new base; do
    MB=/tmp/bn1/bench/qk-mgpu-bench; [ $t = base ] && MB=/tmp/bb2/bench/qk-mgpu-bench
    line="$r $t:"
    for c in "auto 32768" "fp32 32768" "auto 65536"; do
      set -- $c
      for g in 0 0,1; do
        timeout 60 $MB --features 8 --n $2 --precision $1 --gpus $g --reps 15 --label "$1_$2_g$g" > $W/mgpu-$t-$1-$2-$g-$r.log 2>&1
        line="$line $1/$2/g$g $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$t-$1-$2-$g-$r.log | cut -d' ' -f2)"
      done
    done
    echo "$line"
  done
done
echo "A/B $(el) s"
grep -h "first GPU, last engine call\|GPU finish" $W/mgpu-*-auto-32768-0,1-3.log
mkdir -p /tmp/qk_mgpu; timeout 150 /tmp/bn1/tests/gpu/test_mgpu /tmp/qk_mgpu > $W/test_mgpu.log 2>&1; echo "test_mgpu rc $? $(tail -1 $W/test_mgpu.log) $(el) s"
grep -m5 -i fail $W/test_mgpu.log | grep -v "0 fail"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/bn1/bench/qk-mgpu-bench --features 8 --n 12000 --gpus 0,1 --reps 2 > $W/memcheck-2gpu.log 2>&1; echo "memcheck 2 GPUs rc $? $(grep 'ERROR SUMMARY' $W/memcheck-2gpu.log)"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/bn1/bench/qk-mgpu-bench --features 8 --n 6000 --gpus 0,1 --reps 2 --output host > $W/memcheck-2gpu-host.log 2>&1; echo "memcheck 2 GPUs host rc $? $(grep 'ERROR SUMMARY' $W/memcheck-2gpu-host.log)"
echo "total $(el) s"
cd $W && tar czf $OUT/run101.tgz .
