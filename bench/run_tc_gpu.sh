#!/bin/bash
# The fused tensor-core Gram kernel (issue 12; docs/precision.md, "Fused tensor-core kernel") in
# one device call: build this tree (sm_90) into build-gpu-tc; the host emulation of its fragment
# map and the planner tests; the GPU suite up to QMAX qubits (every mode against its stated bound,
# the fused kernel at every qubit count and tile configuration, K(X,X) and K(X,Y), host and device
# outputs, precision auto through the API); qk-bench's tc cases (8 q n=32768, 12 q n=16384,
# 16 q n=4096, hea 12 q n=16384: fp32 as planned, fp32x3 / tf32 / fp16 on the cuBLAS engines and
# on the fused kernel in every configuration, each with its error against fp64); qk-gram
# --precision auto --tol on zz 8 q; the PyTorch peer when PEER holds torch_qk.py. Logs and JSON
# under $OUT; exits non-zero when the build, a test or the bench fails.
# Run from the tree's root: QMAX=12 PEER=.peer bash bench/run_tc_gpu.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
QMAX=${QMAX:-12}; CASES=${CASES:-tc}; PEER=${PEER:-.peer}
PEER_CASES=${PEER_CASES:-zz:8:32768,zz:12:16384,zz:16:4096,hea:12:16384}
B=${B:-build-gpu-tc}
rc=0
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  git rev-parse HEAD 2>/dev/null || cat bench/commit.txt 2>/dev/null
  [ -d $B ] || meson setup $B . -Dgpu_arch=90 >/dev/null
  # register use and spills of the fused kernel (ptxas -v is not in the build flags: one more
  # compile, beside the build)
  nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I. -Xptxas -v -c qk_cuda.cu -o /tmp/qk_cuda_v.o >$OUT/ptxas.log 2>&1 &
  ninja -C $B >$OUT/build.log 2>&1; b=$?; echo "build rc $b"; [ $b = 0 ] || rc=1
  grep -E "warning|error" $OUT/build.log | head -20
  wait
  grep -A2 "Compiling entry function '.*qk__k_tcgram" $OUT/ptxas.log | grep -E "Compiling|registers|spill" | sed 's/Compiling entry function//' | head -80
  meson test -C $B planner tc_fragments --print-errorlogs >$OUT/cpu_tests.log 2>&1; t=$?; echo "planner + fragment emulation rc $t"; [ $t = 0 ] || rc=1
  timeout ${TEST_TIMEOUT:-400} $B/tests/test_gpu_engine $QMAX >$OUT/test_gpu.log 2>&1; t=$?; echo "gpu suite (q<=$QMAX) rc $t"; [ $t = 0 ] || rc=1
  grep -E "FAIL|checks|tensor-core|fp32 engine|autotune|^auto " $OUT/test_gpu.log | head -60
  grep -E "^errq|fused" $OUT/test_gpu.log | grep -v "^  K\[" | head -40
  timeout ${BENCH_TIMEOUT:-300} $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases $CASES >$OUT/bench.log 2>&1
  t=$?; echo "bench rc $t"; [ $t = 0 ] || rc=1
  cat $OUT/bench.log
  python3 -c "
import numpy as np
np.save('/tmp/x8.npy', np.random.default_rng(3).uniform(0, 6.28, (4001, 8)))"
  for tol in "" 1e-3 1e-2; do
    $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8.npy --out /tmp/K_auto$tol.npy --device cuda --precision auto ${tol:+--tol $tol} \
      2>&1 | grep -E "precision|config|engine" | head -4
  done
  python3 -c "
import numpy as np
a = np.load('/tmp/K_auto.npy').astype(float)
for t in ('1e-3', '1e-2'):
    b = np.load('/tmp/K_auto%s.npy' % t)
    print('qk-gram auto tol %s vs default (fp32): max diff %.3g' % (t, abs(a - b).max()))" 2>/dev/null || true
  if [ -f $PEER/torch_qk.py ]; then
    timeout 200 python3 bench/torch_prec.py --peer $PEER --cases $PEER_CASES --json $OUT/peer_prec.json 2>&1 | tail -12
  fi
  echo "run_tc_gpu rc $rc"
  exit $rc
} 2>&1 | tee $OUT/run.log
