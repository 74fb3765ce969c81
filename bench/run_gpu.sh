#!/bin/bash
# One device call: machine facts, build, GPU tests, sanitizers, qk-bench and the peer, all logs
# under $OUT (at most 8 files come back). Run from the worktree root on the GPU machine:
#   bash bench/run_gpu.sh [test-qmax] [bench-cases] [sanitize:0|1]
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
QMAX=${1:-20}; CASES=${2:-zz4,zz8,zz12,zz16,hea12,host8,e2e8}; SAN=${3:-1}
L=$OUT/log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -2
  B=/tmp/b; rm -rf $B
  meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B 2>&1 | grep -E "error|warning|FAILED" ; echo "build rc ${PIPESTATUS[0]}"
  # the tests at sizes for the sanitizers first (small), then the full suite
  if [ "$SAN" = 1 ]; then
    timeout 170 compute-sanitizer --tool memcheck --leak-check full $B/tests/test_gpu_engine 5 > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"; tail -3 $OUT/memcheck.log
    timeout 110 compute-sanitizer --tool racecheck $B/tests/test_gpu_engine 4 0 > $OUT/racecheck.log 2>&1; echo "racecheck rc $?"; tail -3 $OUT/racecheck.log
  fi
  timeout 150 $B/tests/test_gpu_engine $QMAX > $OUT/test_gpu.log 2>&1; echo "test rc $?"; grep -E "FAIL|checks" $OUT/test_gpu.log | head -40
  [ -f bench/commit.txt ] && cat bench/commit.txt
  timeout 150 $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases $CASES; echo "bench rc $?"
  if [ -f .peer/torch_qk.py ]; then timeout 100 python3 .peer/torch_qk.py --json $OUT/peer.json 2>&1 | tail -8; python3 bench/qk_bench_report.py $OUT/bench.json $OUT/peer.json; fi
} 2>&1 | tee $L
