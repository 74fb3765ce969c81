#!/bin/bash
# The few-qubit tensor-core kernel (fused configuration 8, issue 11 item 1) on one GPU: build; the
# few-qubit kernel tests and the GPU suite at 1..9 qubits against the CPU engine; memcheck,
# racecheck and initcheck over the few-qubit tests; qk-bench's small cases (2..6 qubits, n=32768,
# the write floor, each configuration against an fp64 K) and zz4; the PyTorch peer at 2, 4 and 6
# qubits in the same job. One log under $OUT; run from the repo root with COMMIT set.
. bench/gpu_env.sh
{
  qk_gpu_header
  B=/tmp/bs
  qk_gpu_build $B bench/qk-bench tests/test_gpu_engine examples/qk-gram
  QK_TEST_SEED=$RANDOM timeout 240 $B/tests/test_gpu_engine 20 1 ${QS:-1,2,3,4,5,6,7,8,9} > $OUT/test_gpu.log 2>&1
  echo "suite ${QS:-1..9} rc $? : $(grep -E 'checks, ' $OUT/test_gpu.log)"; grep -E 'FAIL|few-qubit' $OUT/test_gpu.log | head -20
  for t in ${SAN:-memcheck racecheck initcheck}; do
    QK_TEST_ONLY=small QK_TEST_UNDER_SANITIZER=1 timeout 150 compute-sanitizer --tool $t --error-exitcode 9 \
      $B/tests/test_gpu_engine > /tmp/san_$t.log 2>&1
    echo "$t small rc $? : $(grep -E 'checks, |ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_$t.log | tr '\n' ' ')"
    grep -m3 -E 'Invalid|Race|Uninit' /tmp/san_$t.log
  done
  echo "$COMMIT" > /tmp/commit.txt
  timeout 200 $B/bench/qk-bench --json $OUT/bench.json --commit /tmp/commit.txt --cases ${CASES:-small,zz4} 2>&1 | grep -E "^(small|zz|write|   ->)"
  timeout 120 python3 .peer/torch_qk.py --cases zz:2:32768,zz:4:32768,zz:6:32768 --json $OUT/peer.json 2>&1 | tail -3
} 2>&1 | tee $OUT/smalltc.log
