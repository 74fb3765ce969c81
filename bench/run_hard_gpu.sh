#!/bin/bash
# Device run for the `hard` branch (issues 14 and 16), one call, logs under $OUT:
#  1. build (sm_90) into build-gpu-hard; the GPU engine suite on a few qubit counts, which
#     exercises cuBLAS now opened with dlopen on first use (qk_cuda.cu, "cuBLAS, opened on first
#     use"): q = 8 and 12 take the cuBLAS engines, q = 3 the fused kernel;
#  2. peak RSS of qk-gram --version / --help / a CPU job (tests/cli_rss.py, limit 40 MB) and, for
#     the record, of a GPU job (cuBLAS mapped only then);
#  3. compute-sanitizer racecheck over the GPU suite with a small scope (QS, default 3,8: one
#     fused and one cuBLAS case, API tests skipped) and a longer limit (RLIM, default 480 s): at
#     QS=3,8,14 racecheck did not finish in 110 s (bench/run_san_gpu.sh).
# Exit status: non-zero when any step fails. Environment: QS, RLIM, SUITE_QS (step 1, 3,8,12).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${B:-build-gpu-hard}; QS=${QS:-3,8}; RLIM=${RLIM:-480}; SUITE_QS=${SUITE_QS:-3,8,12}
fail=0
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  [ -x $B/tests/test_gpu_engine ] || { rm -rf $B; meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B >$OUT/build.log 2>&1; }
  rc=$?; echo "build rc $rc"; [ $rc = 0 ] || { tail -30 $OUT/build.log; exit 1; }
  ldd $B/examples/qk-gram | grep -i -E "cublas|cudart" || echo "qk-gram links no cuBLAS (opened at run time)"

  timeout 300 $B/tests/test_gpu_engine 12 1 $SUITE_QS >$OUT/test_gpu.log 2>&1; rc=$?
  echo "gpu engine suite (q = $SUITE_QS) rc $rc: $(grep -E 'checks, ' $OUT/test_gpu.log)"; grep -E "FAIL" $OUT/test_gpu.log | head -20
  [ $rc = 0 ] || fail=1

  python3 tests/cli_rss.py $B/examples/qk-gram >$OUT/rss.log 2>&1; rc=$?; cat $OUT/rss.log; echo "cli_rss rc $rc"
  [ $rc = 0 ] || fail=1
  python3 -c "import numpy as np; np.save('/tmp/x8h.npy', np.random.default_rng(3).uniform(0, 6.28, (4096, 8)))"
  /usr/bin/time -v $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8h.npy --out /tmp/K8h.npy --device cuda --quiet 2>$OUT/gpu-job-time.txt
  echo "gpu job (zz 8 qubits, cuBLAS) rc $?: $(grep 'Maximum resident' $OUT/gpu-job-time.txt)"

  QK_TEST_UNDER_SANITIZER=1 timeout $RLIM compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_gpu_engine 14 0 $QS \
      >$OUT/san-racecheck.log 2>&1; rc=$?
  echo "racecheck (q = $QS, limit $RLIM s) rc $rc: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $OUT/san-racecheck.log | tr '\n' ' ') $(grep -E 'checks, ' $OUT/san-racecheck.log)"
  [ $rc = 0 ] || fail=1
  echo "overall: $([ $fail = 0 ] && echo ok || echo FAILED)"
  exit $fail
} 2>&1 | tee $OUT/hard.log
