#!/bin/bash
# One device call after merging: build (sm_90), the whole meson suite except the long GPU engine
# suite, that suite up to 16 qubits, qk-gram on the GPU with a profiler trace (GPU lanes checked
# by tests/prof_trace_check.py), qk-bench beside the peer on the cases that the last changes
# touch. Logs under $OUT. Run from the repo root: bash bench/run_gpu_final.sh
# Environment: QMAX (GPU suite qubits, default 16), CASES (qk-bench), PEER_CASES (torch_qk.py),
# SAN=1 adds compute-sanitizer memcheck of the GPU suite at 5 qubits.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
QMAX=${QMAX:-16}; CASES=${CASES:-zz4,zz8,host8,e2e8}; PEER_CASES=${PEER_CASES:-zz:4:32768,zz:8:32768}
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  B=/tmp/bf; rm -rf $B
  meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B >$OUT/build.log 2>&1; echo "build rc $?"
  timeout 200 meson test -C $B --no-rebuild --no-suite gpu --print-errorlogs >$OUT/meson-test.log 2>&1
  echo "meson test (all but suite gpu) rc $?"; grep -E "Ok:|Fail:|Skipped:| FAIL" $OUT/meson-test.log
  timeout 200 $B/tests/test_gpu_engine $QMAX >$OUT/test_gpu.log 2>&1; echo "gpu engine suite (q<=$QMAX) rc $?"; grep -E "FAIL|checks" $OUT/test_gpu.log | head
  if [ "${SAN:-0}" = 1 ]; then
    timeout 150 compute-sanitizer --tool memcheck --leak-check full $B/tests/test_gpu_engine 5 >$OUT/memcheck.log 2>&1
    echo "memcheck rc $?"; tail -2 $OUT/memcheck.log
  fi
  python3 -c "import numpy as np; np.save('/tmp/x8.npy', np.random.default_rng().uniform(0, 6.28, (20000, 8)))"
  $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8.npy --out /tmp/K8.npy --precision fp32 --device cuda \
      --trace $OUT/qkgram-trace.json --profile $OUT/qkgram-profile.txt; echo "qk-gram rc $?"
  python3 tests/prof_trace_check.py --min-gpu-lanes 2 $OUT/qkgram-trace.json; echo "trace check rc $?"
  head -30 $OUT/qkgram-profile.txt
  timeout 120 $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases $CASES; echo "bench rc $?"
  timeout 90 python3 .peer/torch_qk.py --cases $PEER_CASES --json $OUT/peer.json 2>&1 | tail -4
  python3 bench/qk_bench_report.py $OUT/bench.json $OUT/peer.json
} 2>&1 | tee $OUT/final.log
