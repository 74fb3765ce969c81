#!/bin/bash
# run 98: the fused kernel's plane store restored to run 93's loops: the planes part at 16 qubits, then roof16
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
W=/tmp/w98; mkdir -p $W; t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
(meson setup /tmp/bn . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false && ninja -C /tmp/bn tests/gpu/test_gpu_engine) > $W/build.log 2>&1
echo "build rc $? $(( $(date +%s) - t0 )) s"
QK_TEST_ONLY=planes timeout 40 /tmp/bn/tests/gpu/test_gpu_engine 20 1 16 > $W/planes16.log 2>&1; echo "planes 16 rc $? $(tail -2 $W/planes16.log | tr '\n' ' ') $(( $(date +%s) - t0 )) s"
grep -m4 FAIL $W/planes16.log
cd $W && tar czf $OUT/run98.tgz .
