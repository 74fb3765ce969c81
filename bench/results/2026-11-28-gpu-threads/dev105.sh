#!/bin/bash
# run 105 (H100): the final tree (HEAD): the structured pass's plane store A/B against a738843 (roof16 under
# QK_STATES_OLD=1), the planes part at 13 and 14 qubits, issue 26's table with the peer
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w105; mkdir -p $W /tmp/base
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > $W/gpu.txt; cat $W/gpu.txt
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar xzf .peer/base-a738843.tgz -C /tmp/base
(cd /tmp/base && meson setup /tmp/bb . $OPTS && ninja -C /tmp/bb bench/qk-bench) > $W/build-base.log 2>&1 &
(meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench tests/gpu/test_gpu_engine) > $W/build-new.log 2>&1
echo "build new rc $? $(el) s"; wait; echo "build base $(el) s: $(tail -1 $W/build-base.log)"
QK_TEST_ONLY=planes timeout 60 /tmp/bn/tests/gpu/test_gpu_engine 20 1 13,14 > $W/planes.log 2>&1; echo "planes 13,14 rc $? $(tail -2 $W/planes.log | tr '\n' ' ') $(el) s"
for r in 1 2; do
  for t in new base; do
    B=/tmp/bn; [ $t = base ] && B=/tmp/bb
    QK_STATES_OLD=1 timeout 40 $B/bench/qk-bench --cases roof16 > $W/roof16old-$t-$r.log 2>&1
    echo "$t $r: $(grep -E '^roof16 q=16' $W/roof16old-$t-$r.log | grep -v 'fp32 ' | sed -E 's/.*(fp32x3|fp16) .*gram +([0-9.]+) ms.*states +([0-9.]+) ms.*/\1 gram \2 states \3/' | tr '\n' ' ')"
  done
done
echo "A/B $(el) s"
B=/tmp/bn COMMIT=cff3177 CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 200 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $? $(el) s"; cat $W/roof/roofline.md 2>/dev/null | head -30
cd $W && tar czf $OUT/run105.tgz .
