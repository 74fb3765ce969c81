#!/bin/bash
# The session's last H200 check of main: the GPU suite at 3, 8, 13 and 16 qubits against the CPU
# engine, memcheck and racecheck over a 16-qubit qk-gram job (the structured pass), qk-bench
# zz4 / zz8 / zz16. One log under $OUT; run from the repo root.
. bench/gpu_env.sh
{
  qk_gpu_header
  B=/tmp/bf
  qk_gpu_build $B bench/qk-bench tests/test_gpu_engine examples/qk-gram
  QK_TEST_SEED=$RANDOM timeout 120 $B/tests/test_gpu_engine 16 0 3,8,13,16 > $OUT/test_gpu.log 2>&1
  echo "suite rc $? : $(grep -E 'checks, ' $OUT/test_gpu.log)"; grep FAIL $OUT/test_gpu.log | head -5
  python3 -c "import numpy as np; np.save('/tmp/x16.npy', np.random.default_rng(3).random((6,16))*6.28)"
  for t in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $t --error-exitcode 9 $B/examples/qk-gram --x /tmp/x16.npy --map 'zz(reps=2)' \
      --device cuda --out /tmp/K.npy > /tmp/san.log 2>&1
    echo "$t x16 rc $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tr '\n' ' ')"
  done
  timeout 60 $B/bench/qk-bench --json $OUT/bench.json --cases zz4,zz8,zz16 | grep -E "^zz"
} 2>&1 | tee $OUT/final.log
