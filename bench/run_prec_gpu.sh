#!/bin/bash
# Precision modes (issue 12, docs/precision.md) in one device call: build this tree (sm_90) and,
# when MAIN_TREE names another checkout, that tree's qk-gram beside it (the "before" of the fp32
# bitwise check); the GPU suite up to QMAX qubits with its error table; qk-bench's prec and probe
# cases; qk-gram --precision fp32 before and after on the same X (cmp); the PyTorch peer in fp32
# and TF32 (bench/torch_prec.py, PEER = the folder of torch_qk.py). Logs under $OUT.
# Run from the tree's root: QMAX=20 MAIN_TREE=../.. PEER=.peer bash bench/run_prec_gpu.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
QMAX=${QMAX:-12}; CASES=${CASES:-prec,probe}; MAIN_TREE=${MAIN_TREE:-}; PEER=${PEER:-.peer}
PEER_CASES=${PEER_CASES:-zz:8:32768,zz:12:16384,zz:16:4096,hea:12:16384}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  git rev-parse HEAD 2>/dev/null || cat bench/commit.txt 2>/dev/null
  B=/tmp/bp; rm -rf $B
  if [ -n "$MAIN_TREE" ]; then
    ( rm -rf /tmp/bm; meson setup /tmp/bm $MAIN_TREE -Dgpu_arch=90 >/dev/null && ninja -C /tmp/bm examples/qk-gram >$OUT/build-main.log 2>&1
      echo "main qk-gram build rc $?" >>$OUT/build-main.log ) &
  fi
  meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B >$OUT/build.log 2>&1; echo "build rc $?"
  grep -E "warning|error" $OUT/build.log | head
  wait
  [ -n "$MAIN_TREE" ] && tail -1 $OUT/build-main.log
  timeout ${TEST_TIMEOUT:-240} $B/tests/test_gpu_engine $QMAX >$OUT/test_gpu.log 2>&1; echo "gpu suite (q<=$QMAX) rc $?"
  grep -E "FAIL|checks|tensor-core|fp32 engine|autotune" $OUT/test_gpu.log | head -40
  grep "^errq" $OUT/test_gpu.log
  if [ "${SAN:-0}" = 1 ]; then
    timeout 150 compute-sanitizer --tool memcheck --leak-check full $B/tests/test_gpu_engine 8 0 3,8 >$OUT/memcheck.log 2>&1
    echo "memcheck (q = 3, 8; tensor-core blocks) rc $?"; tail -2 $OUT/memcheck.log
  fi
  timeout ${BENCH_TIMEOUT:-240} $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases $CASES >$OUT/bench.log 2>&1; echo "bench rc $?"
  cat $OUT/bench.log
  if [ -n "$MAIN_TREE" ] && [ -x /tmp/bm/examples/qk-gram ]; then
    python3 -c "
import numpy as np
r = np.random.default_rng(3)
np.save('/tmp/x5.npy', r.uniform(0, 6.28, (3001, 5))); np.save('/tmp/x8.npy', r.uniform(0, 6.28, (3001, 8)))
np.save('/tmp/x10.npy', r.uniform(0, 3.14, (1501, 10)))"
    for c in "zz(reps=2) x5" "zz(reps=2) x8" "hea(layers=2) x10"; do
      set -- $c
      /tmp/bm/examples/qk-gram --map "$1" --x /tmp/$2.npy --out /tmp/K_main.npy --device cuda --precision fp32 --no-autotune --quiet
      $B/examples/qk-gram --map "$1" --x /tmp/$2.npy --out /tmp/K_prec.npy --device cuda --precision fp32 --no-autotune --quiet
      cmp /tmp/K_main.npy /tmp/K_prec.npy && echo "fp32 bitwise same as main: $1 $2"
    done
    $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8.npy --out /tmp/K_32.npy --device cuda --precision fp32 --no-autotune --quiet
    $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8.npy --out /tmp/K_x3.npy --device cuda --precision fp32x3 --no-autotune
    python3 -c "
import numpy as np
a, b = np.load('/tmp/K_32.npy'), np.load('/tmp/K_x3.npy')
print('qk-gram fp32x3 vs fp32 (zz 8 q): max diff %.3g, dtype %s' % (abs(a.astype(float) - b).max() if a.shape == b.shape else -1, b.dtype))" 2>/dev/null || true
  fi
  if [ -f $PEER/torch_qk.py ]; then
    timeout 200 python3 bench/torch_prec.py --peer $PEER --cases $PEER_CASES --json $OUT/peer_prec.json 2>&1 | tail -12
  fi
} 2>&1 | tee $OUT/run.log
