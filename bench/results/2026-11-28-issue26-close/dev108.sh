#!/bin/bash
# run 108 (H200): the trapezoid's row-block size (QK_TC_BS) at 12 and 16 qubits; tcblocks under small blocks
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=$OUT; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } | tee $W/gpu.txt
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build.log 2>&1
echo "build rc $? $(el) s"
TG=/tmp/bn/tests/gpu/test_gpu_engine
for bs in 96 160; do
  QK_TC_BS=$bs QK_TEST_ONLY=tcblocks timeout 120 stdbuf -oL $TG > $W/tcblocks-$bs.log 2>&1; echo "tcblocks bs=$bs rc $? $(tail -1 $W/tcblocks-$bs.log) $(el) s"
  grep -m5 FAIL $W/tcblocks-$bs.log
done
for r in 1 2; do
  for bs in def 128 256 512 1024; do
    if [ $bs = def ]; then unset QK_TC_BS; else export QK_TC_BS=$bs; fi
    timeout 90 /tmp/bn/bench/qk-bench --cases roof12,roof16 > $W/roof-$bs-$r.log 2>&1; echo "## bs $bs round $r rc $? $(el) s"
    grep -E "^roof1[26] q=1[26]" $W/roof-$bs-$r.log | grep -v "fp32 " | cut -c1-120
  done
done
unset QK_TC_BS
echo "total $(el) s"
