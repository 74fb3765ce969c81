#!/bin/bash
# run 94: Gauss's row blocks of the trapezoid, at least 256 rows and n/32 (variant) against 512 and n/16 (tree): 8, 12, 16 q A/B
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w94; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s)
mkdir -p /tmp/var && tar --exclude=./.peer --exclude=./.git -cf - . | tar -xf - -C /tmp/var
sed -i '281s|std::max<int64_t>(512, ((m + 15) / 16 + 255) / 256 \* 256)|std::max<int64_t>(256, ((m + 31) / 32 + 255) / 256 * 256)|' /tmp/var/src/cuda/blas.cuh
sed -n 281p /tmp/var/src/cuda/blas.cuh
(cd /tmp/var && python3 src/amalgamate.py && grep -c "(m + 31) / 32" qk_cuda.cu)
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build.log 2>&1 &
(cd /tmp/var && meson setup /tmp/bv . $OPTS && ninja -C /tmp/bv bench/qk-bench tests/gpu/test_gpu_engine) > $W/build-var.log 2>&1 &
wait
echo "builds $(( $(date +%s) - t0 )) s"; tail -1 $W/build.log; tail -1 $W/build-var.log
for r in 1 2; do
  for v in n v; do
    timeout 150 /tmp/b$v/bench/qk-bench --cases roof8,roof12,roof16 --json $W/roof-$v-$r.json > $W/roof-$v-$r.log 2>&1; echo "roof $v $r rc $?"
    grep -E "^roof +(8|12|16) q" $W/roof-$v-$r.log | cut -c1-110
  done
done
QK_TEST_ONLY=tcblocks timeout 120 /tmp/bv/tests/gpu/test_gpu_engine > $W/tcblocks-var.log 2>&1; echo "tcblocks var rc $? $(tail -1 $W/tcblocks-var.log)"
echo "total $(( $(date +%s) - t0 )) s"
cd $W && tar czf $OUT/run94.tgz .
